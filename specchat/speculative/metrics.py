"""Reply metrics, defined once.

acceptance rate = accepted drafts / drafted tokens ("acceptance" in the UI and the bench)
α per draft     = accepted / (accepted + rejections): Leviathan et al.'s alpha, the chance that a
                  draft the target judges is accepted (the only quantity the UI calls α)
tokens/step     = new tokens / target forward passes (includes the corrected or bonus token)
new tokens      = the tokens a reply committed, its end-of-turn token included (generated, never shown);
                  accepted drafts <= new tokens (drafts past an accepted end of turn are not counted)
tok/s           = generated tokens / wall time (never prompt tokens or characters)
generation tok/s = generated tokens / (wall time - prompt reading): the rate the UI shows, so a reply
                  that read a long prompt (or a rerun that read the whole conversation) is compared on
                  its generation alone; the prompt's reading is reported apart
c               = mean drafter forward time / mean target forward time
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specchat.config import Gamma, Mode, to_wire

if TYPE_CHECKING:
    from specchat.speculative.step import StepResult


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement (Leviathan et al. 2023, eq. 1): (1-a^(g+1)) / ((1-a)(g*c+1))."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        expected_tokens = gamma + 1.0
    else:
        expected_tokens = (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return expected_tokens / (gamma * c + 1.0)


@dataclass
class ReplyStats:
    mode: Mode = Mode.SPEC
    gamma: Gamma = 0  # the setting the reply ran with (AUTO: planned per step; see mean_gamma)
    drafter: str = ""  # who drafted in spec mode: model | lookup | auto | self:N
    prompt_tokens: int = 0
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0  # steps that drafted at least one token
    copied_steps: int = 0  # of those, steps drafted by a copy from the chat (the auto and lookup drafters)
    model_steps: int = 0  # of those, steps a drafter model drafted
    target_only_steps: int = 0  # steps with a target forward and no draft
    copy_s: float = 0.0  # wall time of the copied steps (the step's drafting, verification and bookkeeping)
    model_s: float = 0.0  # ... of the model-drafted steps
    target_only_s: float = 0.0  # ... of the target-only steps
    rejections: int = 0  # steps that ended with a rejected draft
    target_forwards: int = 0
    drafter_forwards: int = 0
    wall_s: float = 0.0
    ttft_s: float = 0.0
    target_time_s: float = 0.0  # summed over timed (non-prefill) target forwards
    drafter_time_s: float = 0.0  # summed over timed (non-prefill) drafter forwards
    target_timed: int = 0
    drafter_timed: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was cached (the last turn's, or the warm-up's system prompt)
    prefill_tokens: int = 0  # prompt tokens read into the target's cache before the first step
    prefill_s: float = 0.0  # the time that took (part of wall_s and ttft_s)
    kv_bytes: int = 0  # the target's KV cache at the reply's end (as allocated)
    resident_bytes: int = 0  # the process's resident memory at the reply's end (0 where unknown)
    per_position_drafted: list[int] = field(default_factory=list)  # index i: position i+1
    per_position_accepted: list[int] = field(default_factory=list)
    accepted_histogram: dict[int, int] = field(default_factory=dict)  # accepted length -> steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def generation_s(self) -> float:
        """Wall time less the prompt's reading: the time spent generating."""
        return max(0.0, self.wall_s - self.prefill_s)

    @property
    def generation_tokens_per_s(self) -> float:
        return self.new_tokens / self.generation_s if self.generation_s > 0 else 0.0

    @property
    def first_token_after_prompt_s(self) -> float:
        """ttft less the prompt's reading: how long the first token took once the prompt was read."""
        return max(0.0, self.ttft_s - self.prefill_s)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def cost_ratio(self) -> float:
        """c: mean drafter forward time / mean target forward time (0 when unmeasured)."""
        if not self.drafter_timed or not self.target_timed or self.target_time_s <= 0:
            return 0.0
        return (self.drafter_time_s / self.drafter_timed) / (self.target_time_s / self.target_timed)

    @property
    def measured_speedup(self) -> float:
        """tok/s over the rate of one target forward per token (what target-only decoding would reach)."""
        if not self.target_timed or self.target_time_s <= 0:
            return 0.0
        return self.tokens_per_s * (self.target_time_s / self.target_timed)

    @property
    def per_position_rate(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    @property
    def mean_gamma(self) -> float:
        """Drafts per drafting step: gamma itself, or its average under auto gamma."""
        return self.drafted / self.draft_steps if self.draft_steps else 0.0

    @property
    def alpha_per_draft(self) -> float:
        """α per draft, Leviathan et al.'s alpha: the chance one draft is accepted, accepted / (accepted +
        rejections).

        accepted/drafted understates it: drafts after a rejection are counted but never judged."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    @property
    def predicted_speedup(self) -> float:
        """Leviathan et al.'s bound from the measured alpha and c at the gamma actually used."""
        return leviathan_speedup(self.alpha_per_draft, round(self.mean_gamma), self.cost_ratio)

    def to_dict(self) -> dict[str, Any]:
        plain = {k: v for k, v in self.__dict__.items()}
        plain["gamma"] = to_wire("speculation.gamma", self.gamma)  # auto as -1, as --json and transcripts wrote it
        plain["accepted_histogram"] = {str(k): v for k, v in sorted(self.accepted_histogram.items())}
        for name in (
            "acceptance_rate",
            "tokens_per_step",
            "tokens_per_s",
            "generation_tokens_per_s",
            "cost_ratio",
            "measured_speedup",
            "per_position_rate",
            "prefill_tokens_per_s",
            "mean_gamma",
            "alpha_per_draft",
            "predicted_speedup",
        ):
            plain[name] = getattr(self, name)
        return plain


class StatsRecorder:
    """Collects one reply's counters and timings while the engine runs."""

    def __init__(self, mode: Mode, gamma: Gamma, prompt_tokens: int, reused_tokens: int):
        self.stats = ReplyStats(mode=mode, gamma=gamma, prompt_tokens=prompt_tokens, reused_tokens=reused_tokens)
        self._start = time.perf_counter()
        self._step_began = self._start  # where the next step's time starts: after the last step or the prompt
        self._first_token_at: float | None = None

    def record(self, step: StepResult, kept: int) -> None:
        """One step: its drafts and acceptances, its forwards, and the `kept` tokens it committed. A step cut
        inside its accepted drafts (an accepted end-of-turn token) counts only the drafts it kept, so accepted
        drafts never outnumber the tokens produced; the end-of-turn token itself counts as a produced token."""
        if kept <= step.accepted:
            self.record_drafts(kept, kept)
        else:
            self.record_drafts(step.drafted, step.accepted)
        self.record_tokens(kept)
        self.record_kind(step)
        s = self.stats
        for seconds, timed in step.drafter_forwards():
            s.drafter_forwards += 1
            s.drafter_time_s += seconds if timed else 0.0
            s.drafter_timed += 1 if timed else 0
        if step.target_fed:
            s.target_forwards += 1
            s.target_time_s += step.target_seconds if step.target_timed else 0.0
            s.target_timed += 1 if step.target_timed else 0

    def record_kind(self, step: StepResult) -> None:
        """Count the step as copied, model-drafted or target-only, with the wall time since the last step."""
        now = time.perf_counter()
        seconds, self._step_began = now - self._step_began, now
        s = self.stats
        if step.drafted and step.draft is not None and step.draft.copied:
            s.copied_steps += 1
            s.copy_s += seconds
        elif step.drafted:
            s.model_steps += 1
            s.model_s += seconds
        elif step.target_fed:
            s.target_only_steps += 1
            s.target_only_s += seconds

    def record_drafts(self, drafted: int, accepted: int) -> None:
        s = self.stats
        s.drafted += drafted
        s.accepted += accepted
        if drafted:
            s.draft_steps += 1
            s.rejections += 1 if accepted < drafted else 0
            s.accepted_histogram[accepted] = s.accepted_histogram.get(accepted, 0) + 1
        while len(s.per_position_drafted) < drafted:
            s.per_position_drafted.append(0)
            s.per_position_accepted.append(0)
        for i in range(drafted):
            s.per_position_drafted[i] += 1
            s.per_position_accepted[i] += 1 if i < accepted else 0

    def record_prefill(self, tokens: int, seconds: float) -> None:
        self.stats.prefill_tokens += tokens
        self.stats.prefill_s += seconds
        self._step_began = time.perf_counter()

    def record_tokens(self, n: int) -> None:
        if n and self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        self.stats.new_tokens += n

    def record_memory(self, kv_bytes: int, resident_bytes: int) -> None:
        self.stats.kv_bytes, self.stats.resident_bytes = kv_bytes, resident_bytes

    def finish(self) -> ReplyStats:
        end = time.perf_counter()
        self.stats.wall_s = end - self._start
        self.stats.ttft_s = (self._first_token_at or end) - self._start
        return self.stats
