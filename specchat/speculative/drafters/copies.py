"""Drafts of copied tokens: the lookup drafter's (`lookup`, a MixedDrafter without a model: no model at all)
and the auto drafter's copies, both found by prompt lookup (lookup.py; the idea behind transformers'
`prompt_lookup_num_tokens`). q is one-hot on each copied token, so the rejection rule accepts a copy with
probability p(x) and, on a rejection, resamples from p without x: still exact. Where nothing matches the
draft is empty and the step is the target's alone.
"""

from __future__ import annotations

import torch

from specchat.config import SamplingConfig
from specchat.speculative.drafters.base import Draft


def copy_draft(tokens: list[int], sampling: SamplingConfig, vocab_size: int) -> Draft:
    """A draft of copied tokens: q one-hot on each (None when greedy)."""
    drafts = torch.tensor(tokens, dtype=torch.long)
    q = None if sampling.is_greedy else one_hot(drafts, vocab_size)
    return Draft(drafts, q, [], [1.0] * len(tokens), source="lookup")


def one_hot(drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k, vocab] float32, 1 at each draft: written straight as floats (F.one_hot's int64 rows cost 3× the bytes, and
    a copy of 64 tokens is 64 rows of the whole vocabulary)."""
    q = torch.zeros(drafts.shape[0], vocab_size)
    q[torch.arange(drafts.shape[0]), drafts] = 1.0
    return q
