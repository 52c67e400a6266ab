"""Auto gamma: pick the draft length that maximises the expected speedup from measured alpha and c.

alpha is estimated as a geometric acceptance rate: accepted / (accepted + rejections), which is the
maximum-likelihood estimate when each draft position is accepted independently with probability
alpha until the first rejection. Both alpha and c decay, so the choice follows the text.
When no gamma beats target-only, it drafts nothing, probing with gamma 1 now and then.

The target's forward is not free per row: verifying gamma drafts feeds gamma+1 rows, and on a CPU
kernel each row adds a share r of a one-row step (about 0.18 for w4a8 here, 0.01 for bf16). The
policy fits T(n) = t1 + s·(n−1) to the timed target forwards (their row counts vary as drafts end by
confidence) and plans with c = drafter forward ÷ t1 plus r = s ÷ t1: Leviathan's formula with cost
γ·c + 1 + γ·r against a target-only step of t1. Until two row counts have been seen, r is 0.

Otherwise a draft runs up to `max_draft` tokens and ends once the estimated probability that all
its tokens so far are accepted (`path`, the product of min(1, scale * confidence) over its tokens)
drops below path_floor(): one more token then adds about path * alpha expected tokens, less than the
c * speedup tokens its drafter forward would buy at the current rate. `scale` calibrates the
drafter's confidences: accepted tokens over the summed confidences of the tokens that were judged
(those up to the first rejection).

Copies from the conversation (prompt lookup) are planned apart (copy_length.py): a copy costs no drafter
forward, so its length comes from the copies' own record and the target's row cost. A copy replaces the model's
draft for its step, so it is offered only while its expected tokens per step's time beat the model's (the speedup
above for the planned gamma; 1, a target-only step, where the model drafts nothing), and otherwise one step in
probe_every, so that the record follows the text. Copies teach nothing of alpha or c.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from specchat.config import GAMMA_MAX
from specchat.speculative.copy_length import CopyRecord
from specchat.speculative.drafters.base import DraftPlan
from specchat.speculative.metrics import leviathan_speedup

if TYPE_CHECKING:
    from specchat.speculative.step import StepResult


class GammaPolicy(Protocol):
    """Plans each auto-gamma step's draft and learns from every step's outcome."""

    def plan(self, model: bool = True) -> DraftPlan: ...

    def copy_length(self, gamma: int) -> int: ...

    def observe_step(self, step: StepResult) -> None: ...


@dataclass
class AutoGamma:
    decay: float = 0.9
    probe_every: int = 8
    max_gamma: int = GAMMA_MAX
    max_draft: int = 12  # draft cap while drafts end by confidence (a chosen gamma above it raises it)
    # what it has learnt: not constructor parameters
    accepted: float = field(default=3.0, init=False)  # prior: alpha about 0.75, worth a few steps of evidence
    rejections: float = field(default=1.0, init=False)
    drafter_s: float = field(default=0.0, init=False)  # decayed sums of timed forwards, for c
    drafter_n: float = field(default=0.0, init=False)
    target_s: float = field(default=0.0, init=False)
    target_n: float = field(default=0.0, init=False)
    target_rows: RowCostFit = field(init=False)  # T(n) of the target's forwards by rows fed, copies left out
    copy_rows: RowCostFit = field(init=False)  # the same over every forward, long copies' included: for copies
    said: float = field(default=1.0, init=False)  # decayed sums for calibrating the drafter's confidences
    seen: float = field(default=1.0, init=False)
    copies: CopyRecord = field(default_factory=CopyRecord, init=False)  # how far copies of this chat were accepted
    _idle_steps: int = field(default=0, init=False)
    _copy_idle_steps: int = field(default=0, init=False)  # steps since a copy was last allowed

    def __post_init__(self) -> None:
        self.target_rows = RowCostFit(self.decay)
        self.copy_rows = RowCostFit(self.decay)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    @property
    def cost_ratio(self) -> float:
        if self.drafter_n == 0 or self.target_n == 0 or self.target_s == 0:
            return 0.25  # prior until both models have been timed
        return (self.drafter_s / self.drafter_n) / (self.target_s / self.target_n)

    @property
    def planning_ratio(self) -> float:
        """c + r, both against a one-row target step: what one more drafted token costs, in target steps."""
        fit = self.target_rows.fit()
        if fit is None or self.drafter_n == 0:
            return self.cost_ratio
        one_row, per_row = fit
        return (self.drafter_s / self.drafter_n + per_row) / one_row

    def best_gamma(self) -> int:
        """The gamma of the highest expected speedup, or 0 when none beats target-only by 1%."""
        best_gamma, best = 0, 1.0
        for gamma in range(1, self.max_gamma + 1):
            speedup = leviathan_speedup(self.alpha, gamma, self.planning_ratio)
            if speedup > best * 1.01:
                best_gamma, best = gamma, speedup
        return best_gamma

    def _probe_or_off(self) -> int:
        """While nothing pays: 0, or gamma 1 every probe_every steps so a better stretch is noticed."""
        self._idle_steps += 1
        if self._idle_steps >= self.probe_every:
            self._idle_steps = 0
            return 1
        return 0

    def plan(self, model: bool = True) -> DraftPlan:
        """Off or a one-token probe while drafting does not pay; otherwise a draft that runs on while
        the drafter is sure enough, even where the geometric model picks gamma 1: the per-token
        floor, not gamma, decides where a draft of easy tokens ends. Without a drafter model (`model`
        False: the drafter copies alone) only the copy is planned."""
        if not model:
            return DraftPlan(0, copy=self.copy_length(0))
        gamma = self.best_gamma()
        copy = self.copy_length(gamma)
        if gamma == 0:
            return DraftPlan(self._probe_or_off(), copy=copy)  # no early end
        return DraftPlan(max(gamma, self.max_draft), self.path_floor(gamma), self.calibration, copy=copy)

    def copy_length(self, gamma: int) -> int:
        """How long a copy may run this step (from the copies' record and the target's cost per row), or 0 where
        the model's draft of `gamma` tokens (0: none) is expected to yield more per step's time; then one step in
        probe_every copies still, so that the record learns when copies start to pay."""
        length, rate = self.copies.best_plan(self.row_cost)
        if rate >= leviathan_speedup(self.alpha, gamma, self.planning_ratio):
            self._copy_idle_steps = 0
            return length
        self._copy_idle_steps += 1
        if self._copy_idle_steps >= self.probe_every:
            self._copy_idle_steps = 0
            return length
        return 0

    @property
    def row_cost(self) -> float | None:
        """r: what one more verified row costs, in one-row target steps (None until rows have varied), fitted over
        every forward: a copy's 17-65 rows cost more a row than a draft's few (T(n) is convex on a CPU)."""
        fit = self.copy_rows.fit()
        return None if fit is None else fit[1] / fit[0]

    @property
    def calibration(self) -> float:
        """Accepted tokens per unit of the drafter's confidence (> 1: it is less sure than it should be)."""
        return self.seen / self.said

    def path_floor(self, gamma: int) -> float:
        ratio = self.planning_ratio
        speedup = max(1.0, leviathan_speedup(self.alpha, gamma, ratio))
        return min(0.95, ratio * speedup / max(self.alpha, 1e-3))

    def observe_confidences(self, confidences: list[float], accepted: int) -> None:
        """Compare the drafter's confidences in the judged tokens with how many were accepted."""
        judged = confidences[: accepted + 1]
        if not judged:
            return
        self.said = self.said * self.decay + sum(judged)
        self.seen = self.seen * self.decay + accepted

    def observe_step(self, step: StepResult) -> None:
        """Learn alpha, c and the confidence calibration from one step."""
        for seconds, timed in step.drafter_forwards():
            if timed:
                self.observe_cost("drafter", seconds)
        copied = step.draft is not None and step.draft.copied
        if step.target_fed and step.target_timed:
            self.observe_cost("target", step.target_seconds)
            self.copy_rows.observe(step.target_fed, step.target_seconds)
            if not copied:  # the model's plan prices the rows its own drafts feed
                self.target_rows.observe(step.target_fed, step.target_seconds)
        if copied:
            self.copies.observe(step.drafted, step.accepted)
            return  # a copy says nothing of the drafter model's alpha
        self.observe(step.drafted, step.accepted)
        if step.draft is not None:
            self.observe_confidences(step.draft.confidences, step.accepted)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.accepted = self.accepted * self.decay + accepted
        self.rejections = self.rejections * self.decay + (1 if accepted < drafted else 0)

    def observe_cost(self, which: str, seconds: float) -> None:
        if which == "drafter":
            self.drafter_s = self.drafter_s * self.decay + seconds
            self.drafter_n = self.drafter_n * self.decay + 1
        else:
            self.target_s = self.target_s * self.decay + seconds
            self.target_n = self.target_n * self.decay + 1


@dataclass(frozen=True)
class GammaCurve:
    """Expected speedup against γ from what a policy has measured: Leviathan's formula with the cost of a step
    γ·c + 1 + γ·r (r: what one more verified row costs, T(n) = T(1)·(1 + r·(n−1))), as auto γ plans."""

    alpha: float  # α per draft
    cost: float  # c: a drafter forward ÷ a one-row target forward (the prior until measured)
    row_cost: float | None  # r; None until the target's forwards have fed varied row counts
    measured: bool  # whether c comes from timed forwards, not the prior
    speedups: tuple[float, ...]  # γ = 1 .. GAMMA_MAX
    best: int  # the γ auto plans (0: none beats target-only by 1%)


def gamma_curve(policy: AutoGamma) -> GammaCurve:
    """The policy's expected speedup for every γ from 1 to its max."""
    fit = policy.target_rows.fit()
    ratio = policy.planning_ratio
    row_cost = None if fit is None else fit[1] / fit[0]
    cost = ratio - row_cost if row_cost is not None else ratio
    speedups = tuple(leviathan_speedup(policy.alpha, gamma, ratio) for gamma in range(1, policy.max_gamma + 1))
    measured = policy.drafter_n > 0 and policy.target_n > 0
    return GammaCurve(policy.alpha, cost, row_cost, measured, speedups, policy.best_gamma())


@dataclass
class RowCostFit:
    """A decayed least-squares fit of a forward's time against its rows fed: T(n) = t1 + s·(n−1)."""

    decay: float = 0.9
    weight: float = 0.0
    x: float = 0.0  # decayed sums of x = rows − 1, y = seconds, x², x·y
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        x = rows - 1
        self.weight = self.weight * self.decay + 1
        self.x = self.x * self.decay + x
        self.y = self.y * self.decay + seconds
        self.xx = self.xx * self.decay + x * x
        self.xy = self.xy * self.decay + x * seconds

    def fit(self) -> tuple[float, float] | None:
        """(t1, s) in seconds, or None until the rows fed have varied enough to tell them apart."""
        if self.weight == 0:
            return None
        mean_x, mean_y = self.x / self.weight, self.y / self.weight
        spread = self.xx / self.weight - mean_x * mean_x
        if spread < 0.25:
            return None
        slope = max(0.0, (self.xy / self.weight - mean_x * mean_y) / spread)
        one_row = mean_y - slope * mean_x
        if one_row <= 0:
            return None
        return one_row, slope
