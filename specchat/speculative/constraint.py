"""A constraint on the target's law: the tokens allowed after each context (JSON mode's grammar, say).

The step masks the target's logits with it before p is formed, row by row, each row for the context that precedes
its token (the committed ids, then the drafts before it). Speculation stays exact for the constrained law: the rule
accepts a draft with probability min(1, p/q) under the masked p, whatever q is, and a greedy row takes the masked
argmax, as target-only decoding under the same constraint does. A row after a draft the constraint refuses is never
used (that draft is refused first), so a constraint may allow anything there.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Constraint(Protocol):
    def allowed(self, contexts: list[list[int]], width: int) -> torch.Tensor:
        """[len(contexts), width] bool: the tokens allowed after each context (the whole ids, prompt included)."""
        ...


def constrain(logits: torch.Tensor, constraint: Constraint | None, contexts: list[list[int]]) -> torch.Tensor:
    """[n, vocab] logits with every token the constraint refuses after its row's context at -inf; never in place."""
    if constraint is None:
        return logits
    allowed = constraint.allowed(contexts, logits.shape[-1]).to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))
