"""Prompt lookup: guesses come from earlier text, and checking them never changes a draft."""

from __future__ import annotations

import pytest
from conftest import make_engine, prompt_ids

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.base import DraftPlan, DraftView
from specchat.speculative.drafters.lookup import MAX_GUESS, continuation
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.events import Rejected, ReplyDone, Token
from specchat.speculative.sampling import make_generator


def test_the_longest_then_latest_earlier_match_is_continued():
    ids = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 1, 2, 3, 4]
    assert continuation(ids, 3) == [5, 9, 2]  # [1 2 3 4] matches 4 long at the start
    assert continuation(ids[1:], 2) == [7, 8]  # only [2 3 4] is left: the latest one wins
    assert continuation(ids, 0) == []


def test_short_matches_and_short_texts_give_no_guess():
    assert continuation([5, 6, 1, 2, 7, 1, 2], 4) == []  # [1 2] is below the 3-token minimum
    assert continuation([1, 2, 3], 4) == []
    assert continuation([1, 2, 3, 1, 2, 3], 2, min_ngram=3) == [1, 2]


def test_the_window_limits_how_far_back_it_looks():
    ids = [1, 2, 3, 9] + [0] * 50 + [1, 2, 3]
    assert continuation(ids, 1) == [9]
    assert continuation(ids, 1, window=20) == []


def drafts_of(drafter_model, tokenizer, ids, k, lookup, guesser=None):
    """A fresh drafter's greedy draft, and the number of tokens fed per drafter forward."""
    drafter = ModelDrafter(drafter_model, len(tokenizer), view=DraftView(lookup=lookup))
    if guesser is not None:
        drafter.guesser = guesser
    draft = drafter.propose(ids, DraftPlan(k), SamplingConfig(temperature=0.0), make_generator(0))
    return draft.tokens.tolist(), [fed for fed, _ in draft.forwards], drafter


@pytest.mark.parametrize("wrong_at", [None, 3, 0])
def test_a_checked_guess_keeps_the_draft_and_the_cache_right(similar_drafter_model, tokenizer, wrong_at):
    ids = prompt_ids(tokenizer, "The quick brown")
    expected, plain_fed, _ = drafts_of(similar_drafter_model, tokenizer, ids, 8, lookup=False)
    guess = list(expected)
    if wrong_at is not None:
        guess[wrong_at] = (guess[wrong_at] + 1) % len(tokenizer)

    class Oracle:  # guesses the drafter's own tokens, one of them wrong
        def guess(self, seen, drafted, room):
            return guess[len(drafted) : len(drafted) + min(room, MAX_GUESS)]

    got, fed, drafter = drafts_of(similar_drafter_model, tokenizer, ids, 8, True, Oracle())
    assert got == expected  # rows after a wrong guess come from a correctly cropped cache
    assert len(fed) < len(plain_fed) == 8
    assert drafter.seen == len(ids) + len(expected) - 1  # the last drafted token is fed next step


def events_with(target, drafter_model, tokenizer, ids, lookup: bool, sampling, monkeypatch):
    engine = make_engine(target, drafter_model, tokenizer)
    calls = []
    original = ModelDrafter._next_logits

    def counted(self, step_ids, vocab, keep):
        calls.append(step_ids.shape[1])
        return original(self, step_ids, vocab, keep)

    with monkeypatch.context() as patch:
        patch.setattr(ModelDrafter, "_next_logits", counted)
        events = list(engine.stream(ids, sampling, SpeculationConfig(gamma=6, prompt_lookup=lookup)))
    shown = [
        (type(e).__name__, getattr(e, "id", None), getattr(e, "ids", None))
        for e in events
        if isinstance(e, (Token, Rejected))
    ]
    return shown, events[-1], calls


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=0.0, max_new_tokens=60),
        SamplingConfig(temperature=0.8, top_p=0.9, seed=3, max_new_tokens=60),
    ],
)
def test_lookup_in_the_engine_changes_no_token(target, similar_drafter_model, tokenizer, sampling, monkeypatch):
    ids = prompt_ids(tokenizer, "def reverse(lst):\n    return lst[::-1]\n" * 3)
    plain, plain_done, plain_calls = events_with(
        target, similar_drafter_model, tokenizer, ids, False, sampling, monkeypatch
    )
    looked, looked_done, looked_calls = events_with(
        target, similar_drafter_model, tokenizer, ids, True, sampling, monkeypatch
    )
    assert isinstance(looked_done, ReplyDone) and looked_done.ids == plain_done.ids
    assert looked == plain  # every drafted, rejected and verified token is the same
    assert max(looked_calls) > max(plain_calls)  # some forwards carried guesses
