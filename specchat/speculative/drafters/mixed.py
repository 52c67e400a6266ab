"""The mixed drafter (`speculation.drafter = "auto"`): each step, a prompt-lookup copy where the
conversation offers a match and the plan allows one (plan.copy > 0: auto gamma weighs the copies' record against
the model's drafts, gamma.py), the drafter model elsewhere.

Editing pasted code copies much of the prompt; there a copy is accepted for many tokens at no drafter
cost. In fresh writing matches are rarer and the model drafts as it always does. A step drafts with
one source only, and its Draft carries that source's own q (one-hot for a copy, the model's distribution
otherwise), so the rejection rule stays exact whichever drafts. The model's cache is not fed copied
tokens: it catches up on the committed ones when it next drafts, as after any step.
"""

from __future__ import annotations

import torch

from specchat.config import SamplingConfig
from specchat.speculative.drafters.base import Draft, Drafter, DrafterSetup, DraftPlan, TargetRows
from specchat.speculative.drafters.copies import copy_draft
from specchat.speculative.drafters.lookup import MIN_NGRAM, WINDOW, common_prefix_len, match_start

COPY_MATCH = MIN_NGRAM  # copy where prompt lookup finds a match at all (the newest 3 tokens occurred before)
COPY_TOKENS = 4  # tokens a first copy drafts; one taken whole doubles the next, up to the plan's copy length
# (copy_length.py), and one that is not starts again at 4. The doubling measured ahead of copies of 4 always
# (Intel Xeon, the bench's 4 edit and 4 fresh prompts: 1.73x / 1.76x against 1.61x / 1.65x target-only).
RESUME_TOKENS = COPY_TOKENS  # a guess (past a one-token edit, or from a short match) is drafted this long
SHORT_MATCH = 1  # where no model drafts, a match of the newest token alone is worth a short guess
# Guesses where the model drafts measured behind the model's own drafts (bench edit prompts, one process, the
# variants interleaved, 2 rounds: 2.02x / 2.07x target-only without them, 1.91x / 1.94x with them).


class MixedDrafter:
    """Follows the Drafter protocol; with no drafter model it drafts by lookup alone."""

    def __init__(self, drafter: Drafter | None, vocab_size: int) -> None:
        self.drafter = drafter  # the drafter model's Drafter, or None
        self.vocab_size = vocab_size
        self.copy_tokens = COPY_TOKENS
        self.last_copy: tuple[int, list[int], int] = (0, [], 0)  # where the last copy began, its tokens, its source

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """A copy where the conversation offers one (up to plan.copy tokens), else the model's draft of plan.gamma
        tokens (none when gamma is 0: the step is the target's alone, or a guess's)."""
        model_drafts = self.drafter is not None and plan.gamma > 0
        copy = self._copy(ids, min(plan.copy, plan.room), guess=not model_drafts)
        if copy or not model_drafts:
            return copy_draft(copy, sampling, self.vocab_size)
        assert self.drafter is not None
        return self.drafter.propose(ids, plan, sampling, generator)

    def _copy(self, ids: list[int], limit: int, guess: bool) -> list[int]:
        """Up to `limit` tokens that followed the newest tokens' earlier match. Failing one, where no model drafts
        (`guess`), a short guess: the last copy's source past the one token the target put in its place (an edit
        of one token: a rename), or what followed the newest token's own latest occurrence. Where the model
        drafts, it does better there than a guess (measured on the bench's edit prompts)."""
        if limit <= 0:
            self.last_copy = (len(ids), [], 0)
            return []
        self.copy_tokens = min(self._next_copy_tokens(ids), limit)
        offset = len(ids) - min(len(ids), WINDOW)
        source = match_start(ids[-WINDOW:], COPY_MATCH)
        if source is not None:
            source += offset
        elif guess:
            source = self._resume_at(ids)
            if source is None:
                found = match_start(ids[-WINDOW:], SHORT_MATCH, max_ngram=COPY_MATCH - 1)
                source = None if found is None else found + offset
            self.copy_tokens = min(self.copy_tokens, RESUME_TOKENS)
        copy = ids[source : source + self.copy_tokens] if source is not None else []
        self.last_copy = (len(ids), copy, source or 0)
        return copy

    def _resume_at(self, ids: list[int]) -> int | None:
        """Where the last copy's source goes on if the target replaced one of its tokens (or left one out), or
        None: the last step drafted no copy, took none of it, or took it whole."""
        start, last, source = self.last_copy
        taken = common_prefix_len(ids[start:], last)
        if not last or taken == 0 or taken >= len(last) or len(ids) != start + taken + 1:
            return None
        skipped = source + taken + 1  # the source token the target replaced, passed over
        if skipped < len(ids) - 1 and ids[-1] == ids[skipped]:  # the target left one source token out
            skipped += 1
        return skipped if skipped < len(ids) else None

    def _next_copy_tokens(self, ids: list[int]) -> int:
        """Twice the last copy's length if the target took it whole (it now stands in ids), else COPY_TOKENS."""
        start, last, _ = self.last_copy
        taken_whole = bool(last) and ids[start : start + len(last)] == last
        return 2 * self.copy_tokens if taken_whole else COPY_TOKENS

    def observe(self, ids: list[int], read: int = 0, target: TargetRows | None = None) -> int:
        return self.drafter.observe(ids, read, target) if self.drafter is not None else 0

    def reset(self) -> None:
        self.copy_tokens, self.last_copy = COPY_TOKENS, (0, [], 0)
        if self.drafter is not None:
            self.drafter.reset()


def lookup_from_setup(setup: DrafterSetup, _: int | None) -> MixedDrafter:
    """The `lookup` row's constructor (drafters/registry.py): copies alone, no model."""
    return MixedDrafter(None, setup.vocab_size)


def auto_from_setup(setup: DrafterSetup, _: int | None) -> MixedDrafter:
    """The `auto` row's constructor: a copy where the chat offers one, else the drafter model (if loaded)."""
    return MixedDrafter(setup.model, setup.vocab_size)
