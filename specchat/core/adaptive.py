"""Auto gamma: pick the draft length that maximises the expected speedup from measured alpha and c.

alpha is estimated as a geometric acceptance rate: accepted / (accepted + rejections), which is the
maximum-likelihood estimate when each draft position is accepted independently with probability
alpha until the first rejection. Both alpha and c decay, so the choice follows the text.
When no gamma beats target-only, it drafts nothing, probing with gamma 1 now and then.

Otherwise a draft runs up to `max_draft` tokens and ends once the estimated probability that all
its tokens so far are accepted (`path`, the product of min(1, scale * confidence) over its tokens)
drops below path_floor(): one more token then adds about path * alpha expected tokens, less than the
c * speedup tokens its drafter forward would buy at the current rate. `scale` calibrates the
drafter's confidences: accepted tokens over the summed confidences of the tokens that were judged
(those up to the first rejection).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from specchat.config import GAMMA_MAX
from specchat.core.drafters import DraftPlan
from specchat.core.metrics import leviathan_speedup

if TYPE_CHECKING:
    from specchat.core.step import StepResult


class GammaPolicy(Protocol):
    """Plans each auto-gamma step's draft and learns from every step's outcome."""

    def plan(self) -> DraftPlan: ...

    def observe_step(self, step: "StepResult") -> None: ...



@dataclass
class AutoGamma:
    accepted: float = 3.0      # prior: alpha about 0.75, worth a few steps of evidence
    rejections: float = 1.0
    drafter_s: float = 0.0     # decayed sums of timed forwards, for c
    drafter_n: float = 0.0
    target_s: float = 0.0
    target_n: float = 0.0
    decay: float = 0.9
    probe_every: int = 8
    max_gamma: int = GAMMA_MAX
    max_draft: int = 12        # draft cap while drafts end by confidence (a chosen gamma above it raises it)
    said: float = 1.0          # decayed sums for calibrating the drafter's confidences
    seen: float = 1.0
    _idle_steps: int = 0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    @property
    def cost_ratio(self) -> float:
        if self.drafter_n == 0 or self.target_n == 0 or self.target_s == 0:
            return 0.25  # prior until both models have been timed
        return (self.drafter_s / self.drafter_n) / (self.target_s / self.target_n)

    def choose(self) -> int:
        best_gamma, best = 0, 1.0
        for gamma in range(1, self.max_gamma + 1):
            speedup = leviathan_speedup(self.alpha, gamma, self.cost_ratio)
            if speedup > best * 1.01:
                best_gamma, best = gamma, speedup
        if best_gamma == 0:
            self._idle_steps += 1
            if self._idle_steps >= self.probe_every:
                self._idle_steps = 0
                return 1
        return best_gamma

    def plan(self) -> DraftPlan:
        gamma = self.choose()
        if gamma <= 1:
            return DraftPlan(gamma)  # off, or probing: no early end
        return DraftPlan(max(gamma, self.max_draft), self.path_floor(gamma), self.calibration)

    @property
    def calibration(self) -> float:
        """Accepted tokens per unit of the drafter's confidence (> 1: it is less sure than it should be)."""
        return self.seen / self.said

    def path_floor(self, gamma: int) -> float:
        speedup = max(1.0, leviathan_speedup(self.alpha, gamma, self.cost_ratio))
        return min(0.95, self.cost_ratio * speedup / max(self.alpha, 1e-3))

    def observe_confidences(self, confidences: list[float], accepted: int) -> None:
        """Compare the drafter's confidences in the judged tokens with how many were accepted."""
        judged = confidences[:accepted + 1]
        if not judged:
            return
        self.said = self.said * self.decay + sum(judged)
        self.seen = self.seen * self.decay + accepted

    def observe_step(self, step: "StepResult") -> None:
        """Learn alpha, c and the confidence calibration from one step."""
        for seconds, timed in step.drafter_forwards():
            if timed:
                self.observe_cost("drafter", seconds)
        if step.target_fed and step.target_timed:
            self.observe_cost("target", step.target_seconds)
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
