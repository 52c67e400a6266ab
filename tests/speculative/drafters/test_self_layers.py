"""The self drafter: the target's first N layers draft, sharing its weights, with a cache of their own."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import hf_greedy, make_engine, prompt_ids

from specchat.config import ConfigError, SamplingConfig, SpeculationConfig
from specchat.runtime.lean import LeanKVCache, attach_lean
from specchat.settings import load_config
from specchat.speculative.drafters.self_layers import truncated_model

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=30)
PROMPT = "def reverse(items):"


def full_forward_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_the_view_runs_the_first_layers_and_shares_every_weight(target, tokenizer):
    view = truncated_model(target, 2)
    assert len(view.get_decoder().layers) == 2 and len(target.get_decoder().layers) == 3
    assert target.config.num_hidden_layers == 3  # the target's own config is untouched
    target_weights = {p.data_ptr() for p in target.parameters()}
    assert {p.data_ptr() for p in view.parameters()} <= target_weights
    ids = prompt_ids(tokenizer, PROMPT)
    decoder = target.get_decoder()
    with torch.no_grad():  # by hand: embeddings, two layers, final norm, head
        hidden = decoder(torch.tensor([ids]), output_hidden_states=True).hidden_states[2]
        expected = target.lm_head(decoder.norm(hidden))[0, -1]
    torch.testing.assert_close(full_forward_logits(view, ids), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full_forward_logits(target, ids), full_forward_logits(copy.deepcopy(target), ids))


@pytest.mark.parametrize("lean", [False, True], ids=["transformers", "lean"])
@pytest.mark.parametrize("n", [1, 2])
def test_greedy_self_speculation_equals_the_target_alone(target, tokenizer, n, lean):
    model = copy.deepcopy(target) if lean else target
    if lean:
        assert attach_lean(model) == ""
    engine = make_engine(model, None, tokenizer)
    ids = prompt_ids(tokenizer, PROMPT)
    events = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=3, drafter=f"self:{n}")))
    done = events[-1]
    assert list(done.ids) == hf_greedy(target, ids, 30)
    assert done.stats.drafted > 0 and done.stats.drafter == f"self:{n}"
    drafter = engine.drafters.built[f"self:{n}"]
    assert drafter.kv is not engine.conversation.kv and drafter.seen <= len(engine.ids) - 1
    assert isinstance(drafter.kv, LeanKVCache) == lean


def test_a_self_drafter_beyond_the_targets_layers_is_refused(target, tokenizer):
    engine = make_engine(target, None, tokenizer)
    assert engine.drafter_problem("self:3") == "self:3: the target has 3 layers, so N must be from 1 to 2"
    assert engine.drafter_problem("self:2") is None
    with pytest.raises(ValueError, match="N must be from 1 to 2"):
        list(engine.stream(prompt_ids(tokenizer, PROMPT), GREEDY, SpeculationConfig(drafter="self:7")))
    for bad in ("self:0", "self:", "self:x", "selfish"):
        with pytest.raises(ConfigError, match="model, lookup, auto, head or self:N"):
            load_config(None, [f"speculation.drafter={bad}"])


def test_a_self_drafter_set_behind_the_commands_back_is_one_line_at_the_next_message(target, tokenizer):
    from specchat.config import Config
    from specchat.session.chat import ChatError, ChatSession
    from specchat.tui.commands import build_registry

    session = ChatSession(make_engine(target, None, tokenizer), tokenizer, Config(sampling=GREEDY), 1024)
    registry = build_registry()
    outcome = registry.run(session, "/drafter self:5")
    assert outcome.error and "N must be from 1 to 2" in outcome.message
    assert not registry.run(session, "/set speculation.drafter self:5").error  # the config alone cannot know
    with pytest.raises(ChatError, match="N must be from 1 to 2; choose another with /drafter"):
        list(session.reply("hello"))
    assert session.messages == []
    assert not registry.run(session, "/drafter self:2").error
    list(session.reply("hello"))
    assert session.records[-1].stats.drafter == "self:2"
