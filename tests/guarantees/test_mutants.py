"""Negative controls: each test plants one deliberate bug and asserts that a check of the suite fails.

Two checks carry them. Greedy exactness (speculative == transformers' greedy) catches bugs that change
the output. Bugs in the drafter's state never change the output (verification hides them; they only
cost speed), so `drafts_follow_the_drafter` checks the drafter directly: every step's draft must be
the drafter model's own greedy continuation of the committed prefix, computed without any cache.

A mutant counts as caught only when a check's comparison fails (it returns False): a wrong token, a wrong
draft. A mutant that makes the engine raise while everything so far is right is not caught by the checks:
the exception goes on and its test fails, so a bug that merely crashes can never pass for one the checks see.
"""

from __future__ import annotations

import types

import pytest
import torch
from conftest import hf_greedy, make_engine, prompt_ids

import specchat.speculative.conversation
import specchat.speculative.drafters.model
import specchat.speculative.step
from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative import model_io
from specchat.speculative.drafters.vocab import DraftVocab
from specchat.speculative.events import Token
from specchat.speculative.step import StepResult
from specchat.speculative.verify import Verdict, verify_greedy

N = 32
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=N)
PROMPTS = ("def reverse(lst):", "The quick brown")


def greedy_is_exact(target, drafter_model, tokenizer, speculation=SpeculationConfig(gamma=4)) -> bool:
    """Every reply equals transformers' greedy one, compared token by token as it streams: a reply that goes
    wrong is caught at its first wrong token, even if the engine would raise later; an exception while every
    token so far is right goes on (a crash is not a caught mutant)."""
    engine = make_engine(target, drafter_model, tokenizer)
    for text in PROMPTS:
        ids = prompt_ids(tokenizer, text)
        expected, streamed, last = hf_greedy(target, ids, N), [], None
        for last in engine.stream(ids, GREEDY, speculation):
            if isinstance(last, Token):
                streamed.append(last.id)
                if streamed != expected[: len(streamed)]:
                    return False
        if list(last.ids) != expected:
            return False
    return True


@torch.inference_mode()
def drafters_own_greedy(drafter_model, prefix: list[int], n: int, limit: int = 0) -> list[int]:
    """The drafter's greedy continuation by full forwards (no cache). With `limit` > 0 the argmax
    runs over the ids a restricted draft vocabulary scores: those below it and those in the prefix."""
    seq = list(prefix)
    for _ in range(n):
        logits = drafter_model(torch.tensor([seq])).logits[0, -1]
        if limit:
            allowed = torch.zeros_like(logits, dtype=torch.bool)
            allowed[:limit], allowed[prefix] = True, True
            logits = logits.masked_fill(~allowed, float("-inf"))
        seq.append(int(logits.argmax()))
    return seq[len(prefix) :]


def drafts_follow_the_drafter(target, drafter_model, tokenizer, speculation=SpeculationConfig(gamma=4)) -> bool:
    """Every step's draft is the drafter's own greedy continuation (an exception goes on: not a failed check)."""
    for text in PROMPTS:
        engine = make_engine(target, drafter_model, tokenizer)  # a fresh draft vocabulary per prompt
        prefix = prompt_ids(tokenizer, text)
        for step in engine.steps(prefix, GREEDY, speculation):
            if not isinstance(step, StepResult):  # the prompt's reading, the reply's end
                continue
            drafts = step.draft.tokens.tolist() if step.draft else []
            if drafts and drafts != drafters_own_greedy(drafter_model, prefix, len(drafts), speculation.drafter_vocab):
                return False
            prefix = prefix + step.tokens
    return True


def test_the_checks_pass_on_the_real_engine(target, similar_drafter_model, tokenizer):
    assert greedy_is_exact(target, similar_drafter_model, tokenizer)
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def _crashing_verify(drafts, target_logits, choice=None) -> Verdict:
    raise RuntimeError("a mutant that crashes")


def _crashing_observe(self, ids, read=0) -> int:
    raise RuntimeError("a mutant that crashes")


def test_a_mutant_that_only_crashes_is_not_counted_as_caught(target, similar_drafter_model, tokenizer, monkeypatch):
    """Neither check returns False for an engine that raises: the exception reaches the mutant's test, which fails."""
    with monkeypatch.context() as patch:
        patch.setattr(specchat.speculative.step, "verify_greedy", _crashing_verify)
        with pytest.raises(RuntimeError, match="a mutant that crashes"):
            greedy_is_exact(target, similar_drafter_model, tokenizer)
    with monkeypatch.context() as patch:
        patch.setattr(specchat.speculative.drafters.model.ModelDrafter, "observe", _crashing_observe)
        with pytest.raises(RuntimeError, match="a mutant that crashes"):
            drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def _shifted_crop(shift: int):
    """A stand-in for `module.model_io` whose crop_to keeps `shift` more tokens than asked (when it can)."""

    def crop_to(cache, length):
        model_io.crop_to(cache, min(model_io.kv_length(cache), length + shift))

    return types.SimpleNamespace(**{**vars(model_io), "crop_to": crop_to})


def test_a_target_crop_that_keeps_a_rejected_draft_breaks_exactness(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    monkeypatch.setattr(specchat.speculative.conversation, "model_io", _shifted_crop(1))
    assert not greedy_is_exact(target, similar_drafter_model, tokenizer)


def reads_the_refused_draft(propose):
    """Wrong on purpose: after a rejection the drafter reads the draft the target refused where the target's own
    token stands, and drafts on from there: the stale state a skipped rollback (or one that keeps a token too many)
    leaves in its cache. (Those two as they are end in a forward of no tokens, a crash, not a wrong draft.)"""
    last: dict[str, tuple[int, list[int]]] = {}

    def wrapped(self, ids, plan, sampling, generator):
        if "draft" in last:
            start, drafts = last["draft"]
            accepted = len(ids) - 1 - start
            if 0 <= accepted < len(drafts) and list(ids[start : start + accepted]) == drafts[:accepted]:
                ids = [*ids[:-1], drafts[accepted]]
        draft = propose(self, ids, plan, sampling, generator)
        last["draft"] = (len(ids), draft.tokens.tolist())
        return draft

    return wrapped


def test_a_drafter_that_keeps_a_refused_draft_is_caught_by_the_drafter_check(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    monkeypatch.setattr(
        specchat.speculative.drafters.model.ModelDrafter,
        "propose",
        reads_the_refused_draft(specchat.speculative.drafters.model.ModelDrafter.propose),
    )
    assert greedy_is_exact(target, similar_drafter_model, tokenizer)  # verification hides it...
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)  # ...this does not


def test_a_drafter_that_counts_a_token_fewer_than_it_holds_is_caught_by_the_drafter_check(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    """Wrong on purpose: the drafter's count of the ids its cache stands for is one short, so it reads a
    committed token a second time, one place later than it stands."""
    monkeypatch.setattr(
        specchat.speculative.drafters.model.ModelDrafter,
        "seen",
        property(lambda self: max(0, self.gap.seen(self.cached) - 1)),
    )
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def test_a_draft_vocab_id_shift_is_caught_by_the_drafter_check(target, similar_drafter_model, tokenizer, monkeypatch):
    speculation = SpeculationConfig(gamma=4, drafter_vocab=300)
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, speculation)
    original = DraftVocab.to_ids
    monkeypatch.setattr(DraftVocab, "to_ids", lambda self, positions: original(self, positions) + 1)
    assert greedy_is_exact(target, similar_drafter_model, tokenizer, speculation)  # verification hides it...
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, speculation)  # ...this does not


def bonus_from_the_wrong_row(drafts, target_logits, choice=None) -> Verdict:
    """Wrong on purpose: after every draft is accepted, the bonus token comes from the last draft's row."""
    verdict = verify_greedy(drafts, target_logits)
    gamma = drafts.shape[0]
    if verdict.accepted == gamma and gamma:
        return Verdict(gamma, int(target_logits[gamma - 1].argmax()))
    return verdict


def test_a_bonus_token_from_the_wrong_row_breaks_exactness(target, tokenizer, monkeypatch):
    monkeypatch.setattr(specchat.speculative.step, "verify_greedy", bonus_from_the_wrong_row)
    assert not greedy_is_exact(target, target, tokenizer)  # a drafter equal to the target: all accepted


def drafts_checked_one_row_late(drafts, target_logits, choice=None) -> Verdict:
    """Wrong on purpose: draft i is compared with the target's row i+1 (p and q one row apart)."""
    shifted = torch.cat([target_logits[1:], target_logits[-1:]])
    return verify_greedy(drafts, shifted)


def test_drafts_verified_against_the_next_row_break_exactness(target, similar_drafter_model, tokenizer, monkeypatch):
    monkeypatch.setattr(specchat.speculative.step, "verify_greedy", drafts_checked_one_row_late)
    assert not greedy_is_exact(target, similar_drafter_model, tokenizer)


@pytest.mark.parametrize("gamma", [1, 4])
def test_the_drafter_check_holds_for_other_draft_lengths(target, similar_drafter_model, tokenizer, gamma):
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, SpeculationConfig(gamma=gamma))
