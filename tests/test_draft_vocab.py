"""DraftVocab: ids below the limit plus ids seen, mapped back and padded to the full vocabulary."""
from __future__ import annotations

import torch

from specchat.core.draft_vocab import DraftVocab


def head(vocab=12, hidden=4):
    layer = torch.nn.Linear(hidden, vocab, bias=True)
    torch.nn.init.normal_(layer.weight)
    return layer


def test_scores_low_ids_then_seen_and_always_ids():
    lm_head = head()
    vocab = DraftVocab(lm_head, limit=5, always_ids={11, 2})
    vocab.update([1, 7, 3, 7, 9])
    assert vocab.width == 5 + 3  # 7, 9 seen; 11 always; 2 is already below the limit
    hidden = torch.randn(1, 4)
    with torch.no_grad():
        full = lm_head(hidden)
        part = vocab.logits(hidden)
    assert torch.allclose(part, full[:, [0, 1, 2, 3, 4, 7, 9, 11]])
    assert vocab.to_ids(torch.tensor([0, 4, 5, 6, 7])).tolist() == [0, 4, 7, 9, 11]


def test_full_width_puts_probability_back_on_the_right_ids():
    vocab = DraftVocab(head(), limit=3)
    vocab.update([10, 4])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25]])  # ids 0, 1, 2, 4, 10
    full = vocab.full_width(q, 12)
    assert full.shape == (1, 12) and torch.isclose(full.sum(), torch.tensor(1.0))
    assert full[0, 4] == 0.15 and full[0, 10] == 0.25 and full[0, 3] == 0


def test_the_set_only_grows_and_rescans_a_shorter_conversation():
    vocab = DraftVocab(head(), limit=3)
    vocab.update([5, 6])
    vocab.update([5, 6, 8])
    assert vocab.to_ids(torch.tensor([3, 4, 5])).tolist() == [5, 6, 8]
    vocab.update([9])  # a new, shorter conversation
    assert vocab.width == 3 + 4
