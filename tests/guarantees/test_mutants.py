"""Negative controls: each test plants one deliberate bug and asserts that a check of the suite fails.

Two checks carry them. Greedy exactness (speculative == transformers' greedy) catches bugs that change
the output. Bugs in the drafter's state never change the output (verification hides them; they only
cost speed), so `drafts_follow_the_drafter` checks the drafter directly: every step's draft must be
the drafter model's own greedy continuation of the committed prefix, computed without any cache.
"""
from __future__ import annotations

import types

import pytest
import torch

import specchat.spec.drafters.model
import specchat.spec.engine
import specchat.spec.step
from conftest import hf_greedy, make_engine, prompt_ids
from specchat.config import SamplingConfig, SpeculationConfig
from specchat.spec import model_io
from specchat.spec.drafters.vocab import DraftVocab
from specchat.spec.step import StepResult
from specchat.spec.verify import Verdict, verify_greedy

N = 32
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=N)
PROMPTS = ("def reverse(lst):", "The quick brown")


def greedy_is_exact(target, drafter_model, tokenizer, speculation=SpeculationConfig(gamma=4)) -> bool:
    """Every reply equals transformers' greedy one; a crash counts as a failed check."""
    engine = make_engine(target, drafter_model, tokenizer)
    for text in PROMPTS:
        ids = prompt_ids(tokenizer, text)
        try:
            done = list(engine.stream(ids, GREEDY, speculation))[-1]
        except RuntimeError:
            return False
        if list(done.ids) != hf_greedy(target, ids, N):
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
    return seq[len(prefix):]


def drafts_follow_the_drafter(target, drafter_model, tokenizer, speculation=SpeculationConfig(gamma=4)) -> bool:
    for text in PROMPTS:
        engine = make_engine(target, drafter_model, tokenizer)  # a fresh draft vocabulary per prompt
        prefix = prompt_ids(tokenizer, text)
        try:
            for step in engine.steps(prefix, GREEDY, speculation):
                if not isinstance(step, StepResult):  # the prompt's reading, the reply's end
                    continue
                drafts = step.draft.tokens.tolist() if step.draft else []
                if drafts and drafts != drafters_own_greedy(drafter_model, prefix, len(drafts),
                                                            speculation.drafter_vocab):
                    return False
                prefix = prefix + step.tokens
        except RuntimeError:  # a crash counts as a failed check
            return False
    return True


def test_the_checks_pass_on_the_real_engine(target, similar_drafter_model, tokenizer):
    assert greedy_is_exact(target, similar_drafter_model, tokenizer)
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def _shifted_crop(shift: int):
    """A stand-in for `module.model_io` whose crop_to keeps `shift` more tokens than asked (when it can)."""
    def crop_to(cache, length):
        model_io.crop_to(cache, min(model_io.cache_length(cache), length + shift))
    return types.SimpleNamespace(**{**vars(model_io), "crop_to": crop_to})


def test_a_target_crop_that_keeps_a_rejected_draft_breaks_exactness(target, similar_drafter_model, tokenizer,
                                                                   monkeypatch):
    monkeypatch.setattr(specchat.spec.engine, "model_io", _shifted_crop(1))
    assert not greedy_is_exact(target, similar_drafter_model, tokenizer)


def test_a_skipped_drafter_rollback_is_caught_by_the_drafter_check(target, similar_drafter_model, tokenizer,
                                                                   monkeypatch):
    monkeypatch.setattr(specchat.spec.drafters.model.ModelDrafter, "rollback", lambda self, committed_len: None)
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def test_a_drafter_crop_off_by_one_is_caught_by_the_drafter_check(target, similar_drafter_model, tokenizer,
                                                                  monkeypatch):
    monkeypatch.setattr(specchat.spec.drafters.model, "model_io", _shifted_crop(1))
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer)


def test_a_draft_vocab_id_shift_is_caught_by_the_drafter_check(target, similar_drafter_model, tokenizer,
                                                              monkeypatch):
    speculation = SpeculationConfig(gamma=4, drafter_vocab=300)
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, speculation)
    original = DraftVocab.to_ids
    monkeypatch.setattr(DraftVocab, "to_ids", lambda self, positions: original(self, positions) + 1)
    assert greedy_is_exact(target, similar_drafter_model, tokenizer, speculation)  # verification hides it...
    assert not drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, speculation)  # ...this does not


def bonus_from_the_wrong_row(drafts, target_logits) -> Verdict:
    """Wrong on purpose: after every draft is accepted, the bonus token comes from the last draft's row."""
    verdict = verify_greedy(drafts, target_logits)
    gamma = drafts.shape[0]
    if verdict.accepted == gamma and gamma:
        return Verdict(gamma, int(target_logits[gamma - 1].argmax()))
    return verdict


def test_a_bonus_token_from_the_wrong_row_breaks_exactness(target, tokenizer, monkeypatch):
    monkeypatch.setattr(specchat.spec.step, "verify_greedy", bonus_from_the_wrong_row)
    assert not greedy_is_exact(target, target, tokenizer)  # a drafter equal to the target: all accepted


def drafts_checked_one_row_late(drafts, target_logits) -> Verdict:
    """Wrong on purpose: draft i is compared with the target's row i+1 (p and q one row apart)."""
    shifted = torch.cat([target_logits[1:], target_logits[-1:]])
    return verify_greedy(drafts, shifted)


def test_drafts_verified_against_the_next_row_break_exactness(target, similar_drafter_model, tokenizer,
                                                              monkeypatch):
    monkeypatch.setattr(specchat.spec.step, "verify_greedy", drafts_checked_one_row_late)
    assert not greedy_is_exact(target, similar_drafter_model, tokenizer)


@pytest.mark.parametrize("gamma", [1, 4])
def test_the_drafter_check_holds_for_other_draft_lengths(target, similar_drafter_model, tokenizer, gamma):
    assert drafts_follow_the_drafter(target, similar_drafter_model, tokenizer, SpeculationConfig(gamma=gamma))
