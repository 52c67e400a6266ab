"""The /stats view: the last reply in detail (histogram, acceptance by draft position, speedups) and
the session totals."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specchat.config import Gamma
from specchat.session.repetition import REPETITION
from specchat.session.stop_strings import STOP_STRING
from specchat.speculative.gamma import GammaCurve
from specchat.speculative.metrics import ReplyStats
from specchat.tui.render import as_table, gamma_text, time_split


def _bar(fraction: float, width: int = 24) -> str:
    full = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * full + "·" * (width - full)


def histogram_table(stats: ReplyStats) -> Table:
    """Steps by how many of their drafts were accepted."""
    rows = []
    most = max(stats.accepted_histogram.values(), default=0)
    for length in range(max(stats.accepted_histogram, default=-1) + 1):
        count = stats.accepted_histogram.get(length, 0)
        steps = "step" if count == 1 else "steps"
        rows.append((f"{length} accepted", f"{_bar(count / most if most else 0)} {count} {steps}"))
    return as_table(rows, ("drafts kept", "steps"), title="accepted length per step")


def per_position_table(stats: ReplyStats) -> Table:
    """Acceptance of the i-th draft of a step, given that it was drafted."""
    rows = []
    for i, (accepted, drafted) in enumerate(zip(stats.per_position_accepted, stats.per_position_drafted)):
        rate = accepted / drafted if drafted else 0.0
        rows.append((f"position {i + 1}", f"{_bar(rate)} {rate:.0%} ({accepted}/{drafted})"))
    return as_table(rows, ("draft", "acceptance"), title="acceptance by draft position")


def reply_summary(stats: ReplyStats, stop_reason: str) -> Table:
    rows = [
        (
            "tokens",
            f"{stats.new_tokens} new{' (the end-of-turn token included)' if stop_reason == 'eos' else ''} · "
            f"{stats.prompt_tokens} prompt ({stats.reused_tokens} reused from the cache, "
            f"{stats.prefill_tokens} read)",
        ),
        (
            "time",
            f"{stats.wall_s:.2f} s · ttft {stats.ttft_s:.2f} s · prompt read in {stats.prefill_s:.2f} s · "
            f"{stats.generation_tokens_per_s:.1f} tok/s generating",
        ),
        (
            "acceptance",
            f"accepted {stats.accepted}/{stats.drafted} drafts ({stats.acceptance_rate:.0%}) "
            f"· γ {gamma_text(stats.gamma, stats.mean_gamma)}",
        ),
        (
            "steps",
            f"{stats.target_forwards} target forwards ({stats.copied_steps} copied, {stats.model_steps} "
            f"model-drafted, {stats.target_only_steps} target-only) · {stats.drafter_forwards} drafter forwards "
            f"· {stats.tokens_per_step:.2f} tok/step",
        ),
        ("time split", time_split(stats)),
        ("cost c", f"{stats.cost_ratio:.3f} (drafter forward ÷ target forward)"),
        (
            "speedup",
            f"measured {stats.measured_speedup:.2f}× (vs one target forward per token) "
            f"· predicted {stats.predicted_speedup:.2f}× (Leviathan et al., α per draft "
            f"{stats.alpha_per_draft:.2f}, γ {round(stats.mean_gamma)}, c {stats.cost_ratio:.2f})",
        ),
        ("memory", memory_text(stats)),
        (
            "stopped",
            {
                "eos": "end of turn",
                "max_tokens": "the /max cap (cut)",
                "cancelled": "cancelled (cut)",
                "context_full": "the context window was full (cut)",
                STOP_STRING: "the model began the next User: turn (cut there)",
                REPETITION: "the reply was repeating itself (cut: sampling.repetition_stop)",
            }.get(stop_reason, stop_reason),
        ),
    ]
    return as_table(rows, ("last reply", f"mode {stats.mode}"))


def memory_text(stats: ReplyStats) -> str:
    """`1.87 GiB resident · target KV cache 14.0 MiB allocated, 412 tokens held`."""
    resident = f"{stats.resident_bytes / 2**30:.2f} GiB resident" if stats.resident_bytes else "resident memory unknown"
    held = stats.prompt_tokens + stats.new_tokens
    return f"{resident} · target KV cache {stats.kv_bytes / 2**20:.1f} MiB allocated, {held} tokens held"


def totals_table(totals, kernel: str = "") -> Table:
    """Session totals; `kernel`: the w4a8 kernel's code path, when a model runs on it."""
    rows = [
        ("replies", str(totals.replies)),
        ("tokens", f"{totals.new_tokens} in {totals.wall_s:.1f} s · {totals.tokens_per_s:.1f} tok/s"),
        (
            "acceptance",
            f"accepted {totals.accepted}/{totals.drafted} drafts ({totals.acceptance_rate:.0%})"
            f" · {totals.tokens_per_step:.2f} tok/step",
        ),
    ]
    if kernel:
        rows.append(("kernel", f"{kernel} (the w4a8 products' code path; runtime.kernel chooses)"))
    return as_table(rows, ("session", "total"))


def gamma_curve_table(curve: GammaCurve, setting: Gamma) -> Group:
    """Expected speedup for γ 1..16 from this session's measured α, c and row cost, as auto γ plans: a bar each,
    the γ auto picks and the one set marked."""
    most = max(curve.speedups)
    rows = []
    for gamma, speedup in enumerate(curve.speedups, start=1):
        marks = [mark for mark, on in (("auto picks", gamma == curve.best), ("set", gamma == setting)) if on]
        mark = f" ◀ {', '.join(marks)}" if marks else ""
        rows.append((f"γ {gamma}", f"{_bar(speedup / most if most else 0, 20)} {speedup:.2f}×{mark}"))
    if curve.best == 0:
        rows.append(("", "no γ pays: auto drafts nothing, trying γ 1 now and then"))
    table = as_table(rows, ("γ", "expected speedup"), title="expected speedup by γ")
    return Group(table, Text(f"from {curve_inputs(curve)}; /compare gamma measures it", style="dim"))


def curve_inputs(curve: GammaCurve) -> str:
    """`α 0.78 per draft · c 0.21 · a verified row +18% of a step`, saying what is not measured yet."""
    cost = f"c {curve.cost:.2f}" if curve.measured else f"c {curve.cost:.2f}, a prior: not measured yet"
    rows = "row cost not measured yet" if curve.row_cost is None else f"a verified row +{curve.row_cost:.0%} of a step"
    return f"this session's α {curve.alpha:.2f} per draft · {cost} · {rows}"


def stats_detail(record, totals, kernel: str = "", curve: GammaCurve | None = None, setting: Gamma = 0) -> Group:
    """The /stats view: the last reply in detail, its charts, the γ curve (when drafting) and the session totals."""
    stats = record.stats
    parts: list[Any] = [reply_summary(stats, record.stop_reason), Text("")]
    if stats.drafted:
        parts += [histogram_table(stats), Text(""), per_position_table(stats), Text("")]
    if curve is not None:
        parts += [gamma_curve_table(curve, setting), Text("")]
    parts.append(totals_table(totals, kernel))
    return Group(*parts)
