"""How long a copy from the conversation may run: decided from the copies' own record, never the drafter model's.

A copy (prompt lookup: what followed an earlier occurrence of the newest tokens) costs no drafter forward, so
whether it pays depends on two things only: how far copies of this chat are accepted, and what verifying n
more rows costs the target. The record is a decayed survival table: at each position i of a copy, how many
copies were judged there and how many were refused there (a copy taken whole is judged up to its end and says
nothing past it). S(k), the chance that a copy's first k tokens are all accepted, is the product of the
positions' survival rates, each with a weak prior (PRIOR_HAZARD) so that a position never judged is neither
free nor hopeless. A copy of n tokens then yields E(n) = 1 + S(1) + ... + S(n) tokens for a target forward of
n + 1 rows, which costs 1 + r·n one-row steps (r from the target's RowCostFit: T(n) = t1 + s·(n−1), r = s / t1).
The length planned is the n of the most tokens a one-row step's time, E(n) / (1 + r·n): that rate is what the
policy (gamma.py) weighs against the drafter model's draft, which a copy replaces for the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_COPY = 64  # a copy is verified in one forward of at most 65 rows
PRIOR_HAZARD = 0.04  # before any evidence, a copied token is refused 1 time in 25 ...
PRIOR_WEIGHT = 0.5  # ... with the weight of half a judged copy
PRIOR_ROW_COST = 0.15  # r before the target's forwards have been timed at two row counts


@dataclass
class CopyRecord:
    """The decayed survival table of copies, and the copy length it plans."""

    decay: float = 0.95
    judged: list[float] = field(default_factory=lambda: [0.0] * MAX_COPY)  # index i: copy position i+1
    refused: list[float] = field(default_factory=lambda: [0.0] * MAX_COPY)
    copies: int = 0  # copies observed (undecayed), for /stats and tests

    def observe(self, drafted: int, accepted: int) -> None:
        """One copy of `drafted` tokens, of which the first `accepted` were taken."""
        if drafted <= 0:
            return
        self.copies += 1
        self.judged = [weight * self.decay for weight in self.judged]
        self.refused = [weight * self.decay for weight in self.refused]
        for i in range(min(drafted, accepted + 1, MAX_COPY)):
            self.judged[i] += 1.0
        if accepted < drafted and accepted < MAX_COPY:
            self.refused[accepted] += 1.0

    def survival(self, n: int) -> list[float]:
        """S(1..n): the chance that a copy's first k tokens are all accepted, k = 1..n."""
        alive, curve = 1.0, []
        for i in range(min(n, MAX_COPY)):
            hazard = (self.refused[i] + PRIOR_HAZARD * PRIOR_WEIGHT) / (self.judged[i] + PRIOR_WEIGHT)
            alive *= 1.0 - min(1.0, hazard)
            curve.append(alive)
        return curve

    def expected_tokens(self, n: int) -> float:
        """E(n): tokens a copy of n yields, the target's own token included."""
        return 1.0 + sum(self.survival(n))

    def best_length(self, row_cost: float | None, limit: int = MAX_COPY) -> int:
        """The copy length of the most tokens per one-row step's time; row_cost r (None: the prior)."""
        return self.best_plan(row_cost, limit)[0]

    def best_plan(self, row_cost: float | None, limit: int = MAX_COPY) -> tuple[int, float]:
        """(n, E(n) / (1 + r·n)) of the copy length of the most tokens per one-row step's time: the rate is in
        tokens per one-row step's time, as a target-only step yields 1 and the model's draft its speedup."""
        r = PRIOR_ROW_COST if row_cost is None else max(0.0, row_cost)
        best_n, best_rate, tokens = 1, 0.0, 1.0
        for n, alive in enumerate(self.survival(limit), start=1):
            tokens += alive
            rate = tokens / (1.0 + r * n)
            if rate > best_rate * 1.001:  # a longer copy must pay its rows
                best_n, best_rate = n, rate
        return best_n, best_rate
