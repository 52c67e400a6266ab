"""What a pair can pay, measured at start: the step costs, c, and the acceptance the drafts need.

After the warm-up's first reply (which pays first-call set-up), a second short reply with the drafter is
timed: a target step (a verification forward) and a drafter forward. With c = drafter ÷ target, Leviathan
et al.'s expected speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)) is 1 at one α per draft: below it drafting loses
time, above it it pays. The banner says that α, and what 80% would give.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.speculative.metrics import ReplyStats, leviathan_speedup

FALLBACK_GAMMA = 4  # the γ the line is about when speculation.gamma is auto
GOOD_ALPHA = 0.8  # the acceptance the line quotes a speedup for


@dataclass(frozen=True)
class PairCost:
    target_step_s: float  # one target forward over a step's drafts
    drafter_forward_s: float  # one drafter forward (one draft token)
    gamma: int

    @property
    def c(self) -> float:
        return self.drafter_forward_s / self.target_step_s

    def break_even_alpha(self) -> float | None:
        """The α per draft at which drafting γ a step neither gains nor loses; None where no α pays."""
        if leviathan_speedup(1.0, self.gamma, self.c) <= 1.0:
            return None
        low, high = 0.0, 1.0
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (low, middle) if leviathan_speedup(middle, self.gamma, self.c) >= 1.0 else (middle, high)
        return high

    def line(self) -> str:
        costs = (
            f"expected: c {self.c:.2f} (drafter forward {self.drafter_forward_s * 1e3:.1f} ms, "
            f"target step {self.target_step_s * 1e3:.1f} ms)"
        )
        alpha = self.break_even_alpha()
        if alpha is None:
            return f"{costs}; the drafter costs as much as the target: drafting cannot pay (/mode target)"
        good = leviathan_speedup(GOOD_ALPHA, self.gamma, self.c)
        return (
            f"{costs}; γ {self.gamma} pays once over {alpha:.0%} of drafts are accepted "
            f"({good:.1f}× at {GOOD_ALPHA:.0%})"
        )


def measured_cost(stats: ReplyStats, gamma: int) -> PairCost | None:
    """The pair's cost from a timed reply's stats; None where it timed no target step or no drafter forward."""
    if not stats.target_timed or not stats.drafter_timed or stats.target_time_s <= 0:
        return None
    return PairCost(stats.target_time_s / stats.target_timed, stats.drafter_time_s / stats.drafter_timed, gamma)
