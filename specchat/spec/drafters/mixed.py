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
from collections.abc import Collection

import torch

from specchat.config import SamplingConfig
from specchat.spec import model_io
from specchat.spec.drafters.base import Draft, Drafter, DraftPlan
from specchat.spec.drafters.lookup import MIN_NGRAM, WINDOW, continuation
from specchat.spec.drafters.lookup_drafter import LookupDrafter

COPY_MATCH = MIN_NGRAM  # copy where prompt lookup finds a match at all (the newest 3 tokens occurred before)
COPY_TOKENS = 4  # tokens a first copy drafts
MAX_COPY = 16  # a copy taken whole doubles the next one, up to this; one that is not starts again at 4.
# Measured with speculation.prompt_lookup on (the bundled config's), two runs of the bench's 4 edit and 4 fresh
# prompts each (Intel Xeon, avx512-vnni/amx, where 9 verified rows cost 1.75 one-row steps and 17 cost 2.8):
# 1.73x / 1.76x and 1.70x / 1.86x target-only (greedy / sampled), against 1.61x / 1.65x and 1.64x / 1.60x with
# copies of 4 always and no lookup in the model's forwards; alone, each of the two measured within the noise.
# On an AVX2 EPYC with the kernel of the release before (every verified row dearer) doubling measured worse.
# MAX_COPY 32 against 16 (the 4 edit prompts, 2 runs, interleaved): 39.86 / 38.70 tok/s against 39.67 / 39.74
# (greedy / sampled), 7.8 / 7.5 tokens a step against 7.3 / 7.9: no better; copies of 16 are taken 15.1 tokens deep.


class MixedDrafter:
    """Follows the Drafter protocol; with no drafter model it drafts by lookup alone."""

    def __init__(self, drafter: Drafter | None, vocab_size: int) -> None:
        self.drafter = drafter  # the drafter model's Drafter, or None
        self.lookup = LookupDrafter(vocab_size)
        self.copy_tokens = COPY_TOKENS
        self.last_copy: tuple[int, list[int]] = (0, [])  # where the last step's copy began, and its tokens

    @property
    def model(self) -> model_io.Model | None:
        """The drafter model itself (the engine's clock reads it), or None."""
        model: model_io.Model | None = getattr(self.drafter, "model", None)
        return model

    @property
    def seen(self) -> int:
        return self.drafter.seen if self.drafter is not None else 0

    def configure(self, vocab_limit: int, always_ids: Collection[int], lookup: bool = False, context: int = 0) -> None:
        if self.drafter is not None:
            self.drafter.configure(vocab_limit, always_ids, lookup, context)

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        self.copy_tokens = self._next_copy_tokens(ids)
        copy = continuation(ids[-WINDOW:], min(self.copy_tokens, plan.room), min_ngram=COPY_MATCH)
        self.last_copy = (len(ids), copy)
        if not copy and self.drafter is not None:
            return self.drafter.propose(ids, plan, sampling, generator)
        return dataclasses.replace(
            self.lookup.copy_draft(copy, sampling), by_plan=not copy
        )  # empty: no match, no model

    def _next_copy_tokens(self, ids: list[int]) -> int:
        """Twice the last copy's length if the target took it whole (it now stands in ids), else COPY_TOKENS."""
        start, last = self.last_copy
        taken_whole = bool(last) and ids[start : start + len(last)] == last
        return min(MAX_COPY, 2 * self.copy_tokens) if taken_whole else COPY_TOKENS

    def rollback(self, committed_len: int) -> None:
        if self.drafter is not None:
            self.drafter.rollback(committed_len)

    def catch_up(self, ids: list[int], upto: int) -> None:
        if self.drafter is not None:
            self.drafter.catch_up(ids, upto)

    def reset(self) -> None:
        self.copy_tokens, self.last_copy = COPY_TOKENS, (0, [])
        if self.drafter is not None:
            self.drafter.reset()
