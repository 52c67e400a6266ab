"""The lookup drafter: no model at all. It drafts by prompt lookup, copying what followed the newest
matching n-gram earlier in the conversation (lookup.py; the idea behind transformers'
`prompt_lookup_num_tokens`). Its q is one-hot on each copied token, so the rejection rule accepts a
copy with probability p(x) and, on a rejection, resamples from p without x: still exact. Where
nothing matches it drafts nothing and the step is the target's alone.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from specchat.config import SamplingConfig
from specchat.spec.drafters.base import Draft, DraftPlan
from specchat.spec.drafters.lookup import WINDOW, continuation


class LookupDrafter:
    """Follows the Drafter protocol; it keeps no state, so rollback and reset have nothing to undo."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.seen = 0  # it reads no prompt: nothing is ever cached

    def configure(self, vocab_limit: int, always_ids: Collection[int], lookup: bool = False, context: int = 0) -> None:
        return None  # the model drafter's options (vocabulary limit, guesses, context) mean nothing here

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        return self.copy_draft(continuation(ids[-WINDOW:], plan.gamma), sampling)

    def copy_draft(self, tokens: list[int], sampling: SamplingConfig) -> Draft:
        """A draft of copied tokens: q one-hot on each (None when greedy)."""
        drafts = torch.tensor(tokens, dtype=torch.long)
        q = None if sampling.is_greedy else torch.nn.functional.one_hot(drafts, self.vocab_size).float()
        return Draft(drafts, q, [], [1.0] * len(tokens), source="lookup")

    def rollback(self, committed_len: int) -> None:
        return None

    def catch_up(self, ids: list[int], upto: int) -> None:
        return None

    def reset(self) -> None:
        return None
