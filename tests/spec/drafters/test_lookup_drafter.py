"""The lookup drafter (prompt lookup, no model), switching drafters live, and /compare drafters."""
from __future__ import annotations

import threading

import pytest

from conftest import hf_greedy, make_engine, prompt_ids
from specchat.config import Config, SamplingConfig, SpeculationConfig, drafter_needed
from specchat.spec.events import Origin
from specchat.spec.model_io import cache_length
from specchat.session.chat import ChatError, ChatSession
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
    assert all(token.q == 1.0 for token in drafted)  # a copied token's q is one-hot
    assert "lookup drafter" in stats_line(done.stats)


def test_switching_drafters_between_turns_stays_exact(target, similar_drafter_model, tokenizer):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    conversation = prompt_ids(tokenizer, REPEATING)
    for drafter in ("model", "lookup", "model", "lookup"):
        events = list(engine.stream(conversation, GREEDY, SpeculationConfig(gamma=3, drafter=drafter)))
        done = events[-1]
        assert list(done.ids) == hf_greedy(target, conversation, 30)
        assert engine.drafter is engine.drafters[drafter]
        assert cache_length(engine.cache) == len(engine.ids) - 1
        conversation = list(engine.ids) + prompt_ids(tokenizer, " and again")
    assert engine.drafters["model"].seen <= len(engine.ids) - 1


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
    assert outcome.error and "model, lookup, auto or self:N" in outcome.message


def test_compare_drafters_races_each_drafter_and_leaves_the_chat_untouched(target, similar_drafter_model,
                                                                          tokenizer):
    registry = build_registry()
    session = session_on(target, similar_drafter_model, tokenizer)
    assert registry.run(session, "/compare drafters").error  # no reply yet
    list(session.reply(REPEATING))
    engine = session.engine
    before = (list(session.messages), list(engine.ids), cache_length(engine.cache), engine.drafter.seen,
              len(session.records), session.config)
    from specchat.session.drafter_race import race
    runs = list(race(session, threading.Event()))
    assert [run.drafter for run in runs] == ["none", "model", "lookup", "auto", "self:1"]  # self: a quarter of 3 layers
    for run in runs:
        assert run.stats.new_tokens == session.records[-1].stats.new_tokens  # greedy: the same reply each time
    assert runs[0].stats.drafted == 0 and runs[1].stats.drafted > 0 and runs[0].speedup == 1.0
    outcome = registry.run(session, "/compare drafters")
    assert not outcome.error and outcome.message.startswith("racing 5 ways to answer the last prompt")
    lines = list(outcome.work(threading.Event()))
    assert [line.split(":")[0] for line in lines[:5]] == ["  1/5 none", "  2/5 model", "  3/5 lookup", "  4/5 auto",
                                                          "  5/5 self"]
    cancelled = threading.Event()
    cancelled.set()
    assert list(outcome.work(cancelled)) == ["/compare drafters: cancelled; nothing changed"]
    after = (list(session.messages), list(engine.ids), cache_length(engine.cache), engine.drafter.seen,
             len(session.records), session.config)
    assert after == before


def test_compare_drafters_runs_in_the_repl_with_progress(target, similar_drafter_model, tokenizer):
    import io
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    from specchat.tui.render import Renderer, make_console
    from specchat.tui.repl import Repl
    session = session_on(target, similar_drafter_model, tokenizer)
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text("def add(a, b): return a + b; def add(a, b):\r/compare drafters\r/quit\r")
        Repl(session, build_registry(), Renderer(make_console(False, out)), InMemoryHistory(), pt_input=pipe,
             pt_output=DummyOutput()).run()
    screen = out.getvalue()
    assert "racing 5 ways" in screen and "5/5 self:1" in screen and "◀ fastest" in screen
    assert len(session.records) == 1


def test_a_drafter_that_drafted_nothing_is_never_called_the_fastest():
    from specchat.spec.metrics import ReplyStats
    from specchat.session.drafter_race import RaceRun
    from specchat.tui.compare_view import race_view
    from specchat.tui.render import make_console
    import io
    runs = [RaceRun("none", ReplyStats(new_tokens=40, wall_s=40.0, target_forwards=40), 1.0),
            RaceRun("lookup", ReplyStats(new_tokens=40, wall_s=20.0, target_forwards=40), 2.0),
            RaceRun("model", ReplyStats(new_tokens=40, wall_s=30.0, drafted=30, accepted=20, target_forwards=15), 1.3)]
    out = io.StringIO()
    make_console(False, out).print(race_view(runs))
    screen = out.getvalue()
    assert "fastest: model — switch with /drafter model" in screen
    assert [line.split()[0] for line in screen.splitlines() if "◀ fastest" in line] == ["model"]
