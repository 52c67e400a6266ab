"""Draw a CompareReport: the replies side by side (stacked when the terminal is narrow), with speed."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from specchat.safe_text import visible
from specchat.session.compare import CompareReport, Run
from specchat.session.drafter_race import NO_DRAFTER, RaceRun, speedup, winner
from specchat.tui.render import coloured_tokens

SIDE_BY_SIDE_MIN_WIDTH = 100


def run_summary(run: Run) -> str:
    """`21 tok · 12.0 tok/s generating · first token 0.09 s after the prompt · prompt 1,440 tok read in 19.2 s`:
    the rate and the first token leave the prompt's reading out, which is shown apart."""
    s = run.stats
    line = (
        f"{s.new_tokens} tok · {s.generation_tokens_per_s:.1f} tok/s generating · "
        f"first token {s.first_token_after_prompt_s:.2f} s after the prompt"
    )
    if s.prefill_tokens:
        line += f" · prompt {s.prefill_tokens:,} tok read in {s.prefill_s:.2f} s"
    if s.drafted:
        line += f" · accepted {s.accepted}/{s.drafted} ({s.acceptance_rate:.0%})"
    return line


def reply_text(run: Run) -> Text:
    """A run's reply: the chat's in its tokens' origin colours, as it streamed; a rerun's plain (one author)."""
    if run.tokens and "".join(token.text for token in run.tokens) == run.text:
        return coloured_tokens(run.tokens)
    return Text(visible(run.text))


def verdict_line(report: CompareReport) -> str:
    saved = report.saved_s
    gain = f"speculation saved {saved:.1f} s on this reply" if saved >= 0 else f"speculation cost {-saved:.1f} s more"
    speed = f"{gain} · speedup {report.speedup:.2f}× vs target-only (generation rates, prompt reading apart)"
    if report.identical:
        return f"{speed} · texts identical"
    if not report.greedy:
        return f"{speed} · texts differ (expected when sampling: same distribution, different draws)"
    d = report.divergence
    why = (
        "a near tie, so low-precision arithmetic can flip it"
        if d.near_tie
        else "not a near tie: this looks like a bug, please report it"
    )
    return (
        f"{speed} · texts differ from token {d.position}: {d.spec_token!r} vs {d.other_token!r}; "
        f"target top-2 logit margin {d.margin:.3f} ({why})"
    )


class CompareView:
    """Styles are dropped by rich itself on a console without colour (plain mode). The replies' text and
    the verdict (which quotes tokens) are shown through safe_text.visible."""

    def __init__(self, report: CompareReport):
        self.report = report

    def _runs(self) -> list[Run]:
        return [self.report.spec, *self.report.others]

    def _side_by_side(self) -> Table:
        table = Table(expand=True, show_lines=False, header_style="bold")
        for run in self._runs():
            table.add_column(run.label, ratio=1, overflow="fold")
        table.add_row(*[reply_text(run) for run in self._runs()])
        table.add_row(*[Text(run_summary(run), style="dim") for run in self._runs()])
        return table

    def _stacked(self) -> Group:
        parts = []
        for run in self._runs():
            parts += [
                Text(f"── {run.label} ──", style="bold"),
                reply_text(run),
                Text(run_summary(run), style="dim"),
            ]
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= SIDE_BY_SIDE_MIN_WIDTH
        yield self._side_by_side() if wide else self._stacked()
        style = "bold green" if self.report.identical else "bold yellow"
        yield Text(visible(verdict_line(self.report)), style=style)


def view_compare_fn(comparer):
    """Adapt a Comparer (which yields data) into the ChatSession's compare_fn (which yields renderables)."""

    def compare_fn(session, prompt_ids, done, cancel):
        for report in comparer(session, prompt_ids, done, cancel):
            yield CompareView(report)

    return compare_fn


@dataclass(frozen=True)
class RaceSubject:
    """What a race compares: the table's first column, the name now in use, and how to switch to another."""

    column: str = "drafter"
    current: str = "model"
    switch: str = "/drafter"
    label: str = ""  # before a name in the advice ("γ " for γs)


def race_view(runs: list[RaceRun], subject: RaceSubject) -> Group:
    """/compare drafters or gamma: one row per way (and none): median generation tok/s over its runs and their
    min–max; "fastest" and the advice to switch only for a winner beyond every spread."""
    best = winner(runs)
    table = Table(header_style="bold", box=None, pad_edge=False)
    for name in (subject.column, "tok/s", "min–max", "acceptance", "tok/step", "c", "speedup", ""):
        table.add_column(name, justify="left" if name in (subject.column, "") else "right")
    for run in runs:
        s = run.stats
        acceptance = f"{s.acceptance_rate:.0%} ({s.accepted}/{s.drafted})" if s.drafted else "–"
        cost = f"{s.cost_ratio:.2f}" if s.drafted and s.drafter_timed else "–"
        low, high = run.spread
        table.add_row(
            run.name,
            f"{run.rate:.1f}",
            f"{low:.1f}–{high:.1f}",
            acceptance,
            f"{s.tokens_per_step:.2f}",
            cost,
            f"{speedup(run, runs):.2f}×",
            "◀ fastest" if run is best else "",
        )
    note = (
        f"median and min–max of {len(runs[0].runs)} runs each, generation tok/s (prompt reading apart); "
        f"a winner only beyond every spread"
    )
    return Group(table, Text(note, style="dim"), Text(race_advice(best, subject), style="bold"))


def race_advice(best: RaceRun | None, subject: RaceSubject) -> str:
    if best is None:
        return "no clear winner: the fastest rates lie within each other's spread (a tie)"
    if best.name == NO_DRAFTER:
        return "the target alone was fastest beyond the spread: /mode target"
    if best.name == subject.current:
        return f"fastest: {subject.label}{best.name}, the {subject.column} in use"
    return f"fastest: {subject.label}{best.name} — switch with {subject.switch} {best.name}"
