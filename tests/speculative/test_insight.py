"""speculative/insight.py's record of a rejection for /why: each model's most likely tokens there, none the sampling
settings exclude (a top-p nucleus of 2 tokens lists 2, not 3 more at probability 0)."""

from __future__ import annotations

import pytest
import torch

from specchat.config import SamplingConfig
from specchat.speculative.insight import drafter_top, rejection_at
from specchat.speculative.sampling import probs_from_logits

NUCLEUS_OF_TWO = SamplingConfig(temperature=1.0, top_p=0.6)


def logits_favouring(width: int, favourites: dict[int, float]) -> torch.Tensor:
    row = torch.full((width,), -20.0)
    for token, logit in favourites.items():
        row[token] = logit
    return row


def test_the_target_top_list_holds_only_the_tokens_sampling_can_emit():
    logits = torch.stack([logits_favouring(50, {7: 2.0, 9: 1.8, 3: 0.5, 11: 0.4}), logits_favouring(50, {1: 1.0})])
    probs = probs_from_logits(logits, NUCLEUS_OF_TWO)
    assert int((probs[0] > 0).sum()) == 2
    rejection = rejection_at(0, 0, drafted=3, emitted=7, logits=logits, probs=probs, q=0.9, drafter_best=None)
    assert [token for token, _ in rejection.target_top] == [7, 9]
    assert sum(p for _, p in rejection.target_top) == pytest.approx(1.0, abs=1e-6)
    assert rejection.drafter_top == ((3, 1.0),)  # a copied draft: q one-hot on the drafted token


def test_the_drafter_top_list_maps_its_vocabulary_onto_token_ids_and_leaves_out_zeros():
    drafter_logits = logits_favouring(4, {2: 3.0, 0: 2.9}).view(1, -1)
    vocab_ids = torch.tensor([40, 41, 42, 43])  # drafter position -> token id
    target_logits = logits_favouring(50, {42: 1.0, 40: 0.9}).view(1, -1)
    best = drafter_top(drafter_logits, NUCLEUS_OF_TWO, vocab_ids)
    rejection = rejection_at(0, 0, drafted=42, emitted=40, logits=target_logits, probs=None, q=0.5, drafter_best=best)
    assert [token for token, _ in rejection.drafter_top] == [42, 40]
    assert len(rejection.target_top) == 5  # greedy: the plain softmax, no token at probability 0
