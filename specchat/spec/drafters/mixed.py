"""The mixed drafter (`speculation.drafter = "auto"`): each step, a prompt-lookup copy where the
conversation offers a match, the drafter model elsewhere.

Editing pasted code copies much of the prompt; there a copy is accepted for many tokens at no drafter
cost. In fresh writing matches are rarer and the model drafts as it always does. A step drafts with
one source only, and its Draft carries that source's own q (one-hot for a copy, the model's distribution
otherwise), so the rejection rule stays exact whichever drafts. The model's cache is not fed copied
tokens: it catches up on the committed ones when it next drafts, as after any step.
"""
from __future__ import annotations

import dataclasses

import torch

from specchat.config import SamplingConfig
from specchat.spec.drafters.base import Draft, DraftPlan, Drafter
from specchat.spec.drafters.lookup import MIN_NGRAM, WINDOW, continuation
from specchat.spec.drafters.lookup_drafter import LookupDrafter

COPY_MATCH = MIN_NGRAM  # copy where prompt lookup finds a match at all (the newest 3 tokens occurred before)
COPY_TOKENS = 4         # tokens a copy drafts. Measured on the bench's edit and fresh prompts (this CPU, AVX2):
# 3-token matches with 4-token copies beat 5- and 8-token matches, and copies that double while taken whole


class MixedDrafter:
    """Follows the Drafter protocol; with no drafter model it drafts by lookup alone."""

    def __init__(self, drafter: Drafter | None, vocab_size: int):
        self.drafter = drafter  # the drafter model's Drafter, or None
        self.lookup = LookupDrafter(vocab_size)

    @property
    def model(self):
        """The drafter model itself (the engine's clock reads it), or None."""
        return getattr(self.drafter, "model", None)

    @property
    def seen(self) -> int:
        return self.drafter.seen if self.drafter is not None else 0

    def configure(self, vocab_limit: int, always_ids, lookup: bool = False) -> None:
        if self.drafter is not None:
            self.drafter.configure(vocab_limit, always_ids, lookup)

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig,
                generator: torch.Generator) -> Draft:
        copy = continuation(ids[-WINDOW:], min(COPY_TOKENS, plan.room), min_ngram=COPY_MATCH)
        if not copy and self.drafter is not None:
            return self.drafter.propose(ids, plan, sampling, generator)
        return dataclasses.replace(self.lookup.copy_draft(copy, sampling), by_plan=not copy)  # empty: no match, no model

    def rollback(self, committed_len: int) -> None:
        if self.drafter is not None:
            self.drafter.rollback(committed_len)

    def catch_up(self, ids: list[int], upto: int) -> None:
        if self.drafter is not None:
            self.drafter.catch_up(ids, upto)

    def reset(self) -> None:
        if self.drafter is not None:
            self.drafter.reset()
