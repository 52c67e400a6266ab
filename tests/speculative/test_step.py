"""The step is pure: a StepResult is what speculative_step computed, and the engine commits a copy of it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids

from specchat.config import SpeculationConfig
from specchat.speculative.events import Origin, Token
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.step import Odds, StepResult
from specchat.speculative.step import token_odds as real_token_odds


def test_a_step_result_cannot_be_assigned_to():
    step = StepResult([1, 2], [Origin.DRAFTED, Origin.BONUS], drafted=1, accepted=1)
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


@dataclasses.dataclass(frozen=True)
class OddsWithSurprisal(Odds):
    """A new per-token figure as a change to step.py would add it: a field of Odds and its line in token_odds."""

    surprisal: float | None = None  # -log2 p: the target's surprise at the token


def token_odds_with_surprisal(p, q, drafted, greedy):
    return [
        OddsWithSurprisal(**vars(odds), surprisal=-math.log2(odds.p) if odds.p else None)
        for odds in real_token_odds(p, q, drafted, greedy)
    ]


def test_a_new_per_token_figure_reaches_each_token_event_with_no_change_beyond_step_py(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    """Committing cuts the figures with the tokens (here at EOS and at the token limit) and each Token event
    carries its own token's: the engine, commit.py and events.py pass a new figure on untouched."""
    import specchat.speculative.step

    monkeypatch.setattr(specchat.speculative.step, "token_odds", token_odds_with_surprisal)
    ids = prompt_ids(tokenizer, "Hello, how are you")
    reference = hf_greedy(target, ids, GREEDY.max_new_tokens)
    for eos_ids, sampling in (({reference[5]}, GREEDY), (set(), dataclasses.replace(GREEDY, max_new_tokens=7))):
        engine = make_engine(target, similar_drafter_model, tokenizer, eos_ids=eos_ids)
        tokens = [e for e in engine.stream(ids, sampling, SpeculationConfig(gamma=4)) if isinstance(e, Token)]
        assert [t.id for t in tokens] == reference[: len(tokens)] and len(tokens) in (6, 7)
        for token in tokens:
            assert isinstance(token.odds, OddsWithSurprisal) and token.odds.p is not None
            assert token.odds.surprisal == pytest.approx(-math.log2(token.odds.p))
