"""The lookup drafter (prompt lookup, no model) and switching drafters live.

/compare drafters: tests/session/test_drafter_race.py."""

from __future__ import annotations

import pytest
from conftest import hf_greedy, make_engine, prompt_ids

from specchat.config import Config, SamplingConfig, SpeculationConfig
from specchat.session.chat import ChatError, ChatSession
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.events import Origin
from specchat.speculative.model_io import kv_length
from specchat.tui.commands import build_registry
from specchat.tui.render import stats_line
from specchat.tui.repl import toolbar_text

REPEATING = "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add(a, b):"
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=30)


def test_greedy_lookup_speculation_equals_the_target_alone_and_really_drafts(target, tokenizer):
    ids = prompt_ids(tokenizer, REPEATING)
    engine = make_engine(target, None, tokenizer)
    events = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=4, drafter="lookup")))
    done = events[-1]
    assert list(done.ids) == hf_greedy(target, ids, 30)
    assert done.stats.drafted > 0 and done.stats.drafter == "lookup"
    drafted = [e for e in events if getattr(e, "origin", None) == Origin.DRAFTED]
    assert all(token.odds.q == 1.0 for token in drafted)  # a copied token's q is one-hot
    assert "lookup drafter" in stats_line(done.stats)


def test_switching_drafters_between_turns_stays_exact(target, similar_drafter_model, tokenizer):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    conversation = prompt_ids(tokenizer, REPEATING)
    for drafter in ("model", "lookup", "model", "lookup"):
        events = list(engine.stream(conversation, GREEDY, SpeculationConfig(gamma=3, drafter=drafter)))
        done = events[-1]
        assert list(done.ids) == hf_greedy(target, conversation, 30)
        assert engine.drafter is engine.drafters.built[drafter]
        assert kv_length(engine.conversation.kv) == len(engine.ids) - 1
        conversation = list(engine.ids) + prompt_ids(tokenizer, " and again")
    assert engine.drafters.built["model"].seen <= len(engine.ids) - 1


def test_without_a_drafter_model_spec_needs_lookup():
    assert drafter_needed(False, "spec") == "mode 'spec' needs a drafter model"
    assert drafter_needed(False, "spec", drafter="lookup") is None
    assert drafter_needed(False, "drafter", drafter="lookup") == "mode 'drafter' needs a drafter model"
    assert drafter_needed(False, "target", "drafter", "lookup") == "compare 'drafter' needs a drafter model"


def session_on(target, drafter_model, tokenizer, **speculation):
    config = Config(sampling=GREEDY, speculation=SpeculationConfig(gamma=3, **speculation))
    return ChatSession(make_engine(target, drafter_model, tokenizer), tokenizer, config, 1024)


def test_the_drafter_command_and_the_toolbar(target, tokenizer):
    registry = build_registry()
    session = session_on(target, None, tokenizer)
    with pytest.raises(ChatError, match="use /drafter lookup or /mode target"):
        list(session.reply("hello"))
    outcome = registry.run(session, "/drafter model")
    assert outcome.error and "no drafter model is loaded; lookup" in outcome.message
    assert registry.run(session, "/mode spec").error
    assert not registry.run(session, "/drafter lookup").error
    assert session.config.speculation.drafter == "lookup"
    assert "spec · drafter lookup · γ 3" in toolbar_text(session)
    assert not registry.run(session, "/mode spec").error
    list(session.reply(REPEATING))
    assert session.records[-1].stats.drafter == "lookup"
    outcome = registry.run(session, "/drafter sideways")
    assert outcome.error and "model, lookup, auto, head or self:N" in outcome.message
