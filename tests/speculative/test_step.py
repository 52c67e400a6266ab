"""The step is pure: a StepResult is what speculative_step computed, and the engine commits a copy of it."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids

from specchat.config import SpeculationConfig
from specchat.speculative.events import Origin
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.step import Judged, StepResult


def test_a_step_result_cannot_be_assigned_to():
    step = StepResult([1, 2], [Origin.DRAFTED, Origin.BONUS], Judged(1, 1))
    for name, value in (("last", True), ("index", 3), ("tokens", [1]), ("rejection", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(step, name, value)


class _Watching(AutoGamma):
    """Auto gamma that keeps every step it observes, and a copy of its tokens as they were then."""

    def __init__(self) -> None:
        super().__init__()
        self.observed: list[tuple[StepResult, list[int]]] = []

    def observe_step(self, step: StepResult) -> None:
        self.observed.append((step, list(step.tokens)))
        super().observe_step(step)


def test_the_engine_cuts_a_copy_and_leaves_the_computed_step_as_it_was(target, tokenizer):
    """An EOS in the middle of a step's accepted drafts: the committed step ends there; the step the policy
    saw keeps every token it computed, its index and its `last` as the step made them."""
    ids = prompt_ids(tokenizer, "Hello, how are you")
    reference = hf_greedy(target, ids, GREEDY.max_new_tokens)
    eos = reference[4]
    policy = _Watching()
    engine = make_engine(target, target, tokenizer, eos_ids={eos}, policy=policy)
    committed = [s for s in engine.steps(ids, GREEDY, SpeculationConfig(gamma=8)) if isinstance(s, StepResult)]
    assert [s.index for s in committed] == list(range(len(committed)))
    assert committed[-1].last and committed[-1].tokens[-1] == eos
    computed, tokens_then = policy.observed[len(committed) - 1]
    assert computed is not committed[-1]
    assert computed.tokens == tokens_then and len(computed.tokens) > len(committed[-1].tokens)
    assert not computed.last and computed.index == 0
