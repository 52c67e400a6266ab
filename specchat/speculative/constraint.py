"""Rules on the target's law: what a request changes of the target's logits, given what came before each token
(JSON mode's grammar mask, a logit bias, a frequency penalty).

The step applies them to the target's logits before p is formed, row by row, each row for the context that precedes
its token (the committed ids, then the drafts before it). Speculation stays exact for the law so changed: the rule
accepts a draft with probability min(1, p/q) under the changed p, whatever q is, and a greedy row takes the changed
argmax, as target-only decoding under the same rules does. A row after a draft the rules refuse (a -inf logit) is
never used, since that draft is refused first; a rule may leave such a row as it likes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class Constraint(Protocol):
    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        """[len(contexts), vocab] logits changed for each row's context (the whole ids, prompt included); never in
        place."""
        ...


class Rules:
    """Several rules, applied in order."""

    def __init__(self, rules: Sequence[Constraint]):
        self.rules = list(rules)

    def apply(self, logits: torch.Tensor, contexts: list[list[int]]) -> torch.Tensor:
        for rule in self.rules:
            logits = rule.apply(logits, contexts)
        return logits


def constrain(logits: torch.Tensor, constraint: Constraint | None, contexts: list[list[int]]) -> torch.Tensor:
    """The logits as `constraint` changes them (as they are where there is none)."""
    return logits if constraint is None else constraint.apply(logits, contexts)


def for_drafts(constraint: Constraint | None) -> Constraint | None:
    """The rules a drafter applies to q: all but those that only read the target's law (`reads_only`, as
    top_logprobs' reader, which counts the target's steps)."""
    rules = constraint.rules if isinstance(constraint, Rules) else [constraint] if constraint is not None else []
    kept = [rule for rule in rules if not getattr(rule, "reads_only", False)]
    return None if not kept else kept[0] if len(kept) == 1 else Rules(kept)
