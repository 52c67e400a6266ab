"""DraftVocab: ids below the limit plus ids seen, mapped back and padded to the full vocabulary."""

from __future__ import annotations

import torch

from specchat.speculative.drafters.vocab import DraftVocab


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


def test_a_conversation_that_changes_early_forgets_the_ids_seen_after_the_change():
    vocab = DraftVocab(head(), limit=3, always_ids=[11])
    vocab.update([5, 6, 8])
    vocab.keep_first(3)  # nothing changed within what was read
    assert vocab.width == 3 + 4
    vocab.keep_first(1)  # the conversation differs after its first id: 6 and 8 may be gone
    vocab.update([5, 7])
    assert vocab.to_ids(torch.arange(vocab.width)).tolist() == [0, 1, 2, 5, 7, 11]


def test_drafter_only_replies_do_not_depend_on_an_earlier_conversation(target, similar_drafter_model, tokenizer):
    """With a restricted drafter vocabulary, a drafter-only reply after /system and /reset equals a fresh
    engine's: ids seen in the old conversation are no longer proposable (found by the churn test)."""
    from conftest import make_engine

    from specchat.config import SamplingConfig, SpeculationConfig

    sampling = SamplingConfig(temperature=0.0, max_new_tokens=20)
    speculation = SpeculationConfig(mode="drafter", drafter_vocab=256)
    new = tokenizer.encode("plain words then hello")
    whole_vocab = SpeculationConfig(mode="drafter", drafter_vocab=0)
    own = list(make_engine(target, similar_drafter_model, tokenizer).stream(new, sampling, whole_vocab))[-1].ids
    beyond = [i for i in own if i >= 256 and i not in new]
    assert beyond  # the drafter's own choices include ids a fresh restricted drafter cannot propose
    used = make_engine(target, similar_drafter_model, tokenizer)
    list(used.stream(list(own) + new, sampling, speculation))  # an old conversation that holds them
    again = list(used.stream(new, sampling, speculation))[-1].ids
    fresh = list(make_engine(target, similar_drafter_model, tokenizer).stream(new, sampling, speculation))[-1].ids
    assert again == fresh
