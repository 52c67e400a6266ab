"""The `head` drafter (speculative/drafters/head.py): a draft head trained for the target in seconds drafts from
the target's own hidden states, which the verification forward hands over; greedy speculation with it is the
target's greedy reply token for token, and a head learns what an untrained one does not."""

from __future__ import annotations

import torch
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids

from specchat.config import SpeculationConfig
from specchat.speculative.drafters.head import FeatureHead
from specchat.training.head_training import agreement, train_on

PROMPT = "def add(a, b):\n    return"


def test_greedy_speculation_with_a_draft_head_is_the_targets_greedy_reply(head_on_target, target, tokenizer):
    engine = make_engine(target, None, tokenizer)
    ids = prompt_ids(tokenizer, PROMPT)
    for gamma in (1, 4):
        engine.reset()
        done = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=gamma, drafter="head")))[-1]
        assert list(done.ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)[: len(done.ids)]
        assert done.stats.drafted > 0 and done.stats.drafter == "head"


def test_training_fits_the_targets_next_hidden_states_on_the_text_it_read(head_on_target):
    """On the text it learnt from, a trained head's first draft is the target's choice most of the time, an
    untrained one's almost never. A tiny random target's states do not generalise from 1,500 positions;
    the bundled target's held-out figure is train-drafter's report (docs/draft-head.md)."""
    head, learnt, rows = head_on_target
    torch.manual_seed(1)
    untrained = FeatureHead(head.out.out_features, head.out.in_features)
    positions = sum(agreement(head, data, rows)[1] for data in learnt)
    trained = sum(agreement(head, data, rows)[0] for data in learnt) / positions
    random = sum(agreement(untrained, data, rows)[0] for data in learnt) / positions
    assert trained > max(0.5, 5 * random)


def test_without_a_trained_head_the_drafter_is_refused_in_one_line(target, tokenizer):
    engine = make_engine(target, None, tokenizer)
    assert "train one with `specchat train-drafter`" in engine.drafter_problem("head")


def test_a_retried_prompt_drafts_from_the_state_its_first_reading_kept(head_on_target, target, tokenizer):
    """A prompt whose tokens are all cached but the newest is read by no forward: the head drafts its first step
    from the hidden state the prompt's first reading handed over, kept while the conversation's start holds."""
    engine = make_engine(target, None, tokenizer)
    ids = prompt_ids(tokenizer, PROMPT)
    speculation = SpeculationConfig(gamma=3, drafter="head")
    first = list(engine.steps(ids, GREEDY, speculation))
    again = [s for s in engine.steps(ids, GREEDY, speculation) if type(s).__name__ == "StepResult"]
    assert again[0].drafted == 3 and [t for s in again for t in s.tokens] == list(first[-1].ids)


def test_without_the_state_of_the_token_before_the_newest_it_drafts_nothing(head_on_target, target, tokenizer):
    """An engine whose drafter is switched to the head after the prompt was read has no hidden state for it: the
    first step is the target's alone, and the head drafts from the states that step hands over."""
    engine = make_engine(target, None, tokenizer)
    ids = prompt_ids(tokenizer, PROMPT)
    list(engine.steps(ids, GREEDY, SpeculationConfig(mode="target")))
    steps = [s for s in engine.steps(ids, GREEDY, SpeculationConfig(gamma=3, drafter="head"))]
    steps = [s for s in steps if type(s).__name__ == "StepResult"]
    assert steps[0].drafted == 0 and any(step.drafted for step in steps[1:])


def test_a_deeper_training_step_adds_the_heads_own_later_drafts_to_its_loss(head_on_target):
    """train-drafter --depth 3: the second and third drafts, each from the head's own previous prediction, add to
    the first's loss (the same noise, no step taken: a learning rate of 0)."""
    head, learnt, rows = head_on_target
    copy = FeatureHead(head.out.out_features, head.out.in_features)
    copy.load_state_dict(head.state_dict())
    optimizer = torch.optim.SGD(copy.parameters(), lr=0.0)
    losses = {}
    for depth in (1, 3):
        torch.manual_seed(7)
        losses[depth] = train_on(copy, optimizer, learnt[0], rows, depth)
    assert losses[3] > 2 * losses[1] > 0
