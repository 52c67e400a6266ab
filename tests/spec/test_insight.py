"""spec/insight.py's top lists for /why: the most likely tokens of a probability row, none the settings exclude."""
from __future__ import annotations

import torch

from specchat.spec.insight import ranked


def test_the_top_list_holds_the_most_likely_tokens_first_with_their_probabilities():
    row = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.1, 0.2])
    listed = ranked(row, k=3)
    assert [i for i, _ in listed] == [1, 3, 5]
    assert [round(p, 4) for _, p in listed] == [0.4, 0.25, 0.2]


def test_tokens_outside_a_nucleus_smaller_than_the_list_are_left_out():
    row = torch.zeros(100)
    row[[7, 42]] = torch.tensor([0.7, 0.3])  # top-p kept two tokens
    assert [i for i, _ in ranked(row)] == [7, 42]


def test_positions_map_onto_token_ids_through_the_drafters_vocabulary():
    row = torch.tensor([0.1, 0.9, 0.0])
    ids = torch.tensor([500, 20, 31])  # position -> token id
    assert ranked(row, ids) == ((20, ranked(row)[0][1]), (500, ranked(row)[1][1]))
