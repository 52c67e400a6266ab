"""Everything the user sees, drawn with rich: coloured tokens, legend, banner, stats, tables.

Plain mode (not a terminal, --no-color, NO_COLOR) uses a Console without a colour system, so no
escape code is ever written; rejected drafts then appear as ~~text~~. Text from a model, a file or the
user always goes through safe_text.visible and into a rich Text (never markup), so the only escape
codes written are specchat's own.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console, Group
from rich.control import Control, ControlType
from rich.table import Table
from rich.text import Text

from specchat.config import QUANTIZATIONS, Gamma, Mode, show_value
from specchat.launch import make_console
from specchat.safe_text import visible
from specchat.session.chat import CONTEXT_FULL, CUT_MARKS
from specchat.speculative.events import Origin, PrefillProgress, Rejected, ReplyDone, StepDone, Token
from specchat.speculative.metrics import ReplyStats

STYLES = {
    Origin.DRAFTED: "green",
    Origin.CORRECTED: "bold red",
    Origin.BONUS: "bold cyan",
    Origin.TARGET: "magenta",
    Origin.DRAFTER: "yellow",
}
COPIED_STYLE = "blue"  # drafted+accepted tokens a copy from the chat drafted (prompt lookup), not the drafter model
REJECTED_STYLE = "dim strike"
LABELS = {
    Origin.DRAFTED: "drafted+accepted",
    Origin.CORRECTED: "target-corrected",
    Origin.BONUS: "target-bonus",
    Origin.TARGET: "target-only",
    Origin.DRAFTER: "drafter-only",
}
MODE_ORIGINS = {  # spec mode: a step that drafts nothing (auto γ, γ 0, no lookup match, the last token) is target-only
    Mode.SPEC: (Origin.DRAFTED, Origin.CORRECTED, Origin.BONUS, Origin.TARGET),
    Mode.TARGET: (Origin.TARGET,),
    Mode.DRAFTER: (Origin.DRAFTER,),
}
# With colour off, runs of these origins are bracketed in the stream (docs/commands.md, "Without colour");
# target-only and drafter-only text is left unmarked. Rare characters, so code's own brackets stay apart.
MARKS = {
    Origin.DRAFTED: ("⟦", "⟧"),
    Origin.CORRECTED: ("⟨", "⟩"),
    Origin.BONUS: ("⦃", "⦄"),
}
NOTE_STYLE = "dim"
STOP_HINT = "(Ctrl-C stops)"  # on the line that waits for a reply's first token
ERROR_STYLE = "bold red"
PREFILL_NOTE_FROM = 128  # prompts of more than one chunk show their reading progress in place of 'thinking…'


def color_wanted(flag: bool, stream: TextIO, environ=os.environ) -> bool:
    """Colour only when asked for, the stream is a terminal, and NO_COLOR is unset (no-color.org)."""
    return flag and not environ.get("NO_COLOR") and bool(getattr(stream, "isatty", lambda: False)())


class Renderer:
    """Draws events and messages on one rich Console."""

    def __init__(
        self, console: Console, show_rejected: bool = False, origin_marks: bool = True, notes: Console | None = None
    ):
        self.console = console
        self.notes = notes  # where a reply's cut mark and stats line go when not after it (stderr, for a pipe)
        self.show_rejected = show_rejected
        self.origin_marks = origin_marks  # with colour off: bracket each run of drafted, corrected, bonus tokens
        self.open_mark: Origin | None = None  # the origin whose run is open (its closing mark not yet written)
        self.at_line_start = True
        self.column = 0  # where the cursor stands on a terminal (cells), for wrapping between words
        self.waiting = False
        self._color_console = console if console.color_system is not None else None
        self._plain_console = make_console(False, console.file) if self._color_console else console

    @property
    def color(self) -> bool:
        return self.console.color_system is not None

    def set_color(self, wanted: bool) -> None:
        """Switch colour off or back on (on only if the output could show it to begin with)."""
        self.close_mark()
        self.console = self._color_console if wanted and self._color_console else self._plain_console

    # ----- streaming ---------------------------------------------------------------------------
    def begin_reply(self) -> None:
        """On a colour terminal, a dim 'thinking…' holds the line until the first token replaces it."""
        self.newline()
        if self.console.is_terminal and self.color:
            self.console.print(Text(f"thinking… {STOP_HINT}", style=NOTE_STYLE), end="")
            self.waiting = True

    def _stop_waiting(self) -> None:
        if self.waiting:
            self._erase_line()
            self.waiting = False

    def _erase_line(self) -> None:
        self.console.control(Control.move_to_column(0), Control((ControlType.ERASE_IN_LINE, 2)))

    def _prefill_progress(self, event: PrefillProgress) -> None:
        """A long prompt's reading progress, in place of 'thinking…' (colour terminals only)."""
        if self.waiting and event.total >= PREFILL_NOTE_FROM:
            self._erase_line()
            self.console.print(Text(f"{prefill_text(event)} {STOP_HINT}", style=NOTE_STYLE), end="")

    def event(self, event: Any) -> None:
        """Draw one item of a reply stream (engine events, notices, compare output)."""
        if isinstance(event, PrefillProgress):
            return self._prefill_progress(event)
        if not isinstance(event, StepDone):
            self._stop_waiting()
        if isinstance(event, Token):
            self._token(event)
        elif isinstance(event, Rejected):
            self._rejected(event)
        elif isinstance(event, ReplyDone):
            self._end_reply(event)
        elif isinstance(event, StepDone):
            return
        elif hasattr(event, "text") and not hasattr(event, "__rich__"):
            self.note(event.text)
        else:
            self.console.print(Text(visible(event)) if isinstance(event, str) else event)

    def _token(self, token: Token) -> None:
        if self.color:
            return self._write(Text(visible(token.text), style=token_style(token)))
        if not self.origin_marks or not token.text or token.origin == self.open_mark:
            return self._write(Text(visible(token.text)))
        self.close_mark()
        opening = MARKS.get(token.origin, ("", ""))[0]
        self.open_mark = token.origin if opening else None
        self._write(Text(opening + visible(token.text)))

    def close_mark(self) -> None:
        """End the open run's bracket (before a rejected draft, a note, or the reply's end)."""
        if self.open_mark is not None:
            closing = MARKS[self.open_mark][1]
            self.open_mark = None
            self._write(Text(closing))

    def _write(self, text: Text) -> None:
        if text.plain:
            if self.console.is_terminal:
                text = self._wrapped_at_word(text)
            self.console.print(text, end="", soft_wrap=True)
            self.at_line_start = text.plain.endswith("\n")

    def _wrapped_at_word(self, text: Text) -> Text:
        """On a terminal, a piece that starts a word past the right margin starts a new line in place of its
        space, so the terminal's own wrap does not cut the word (a word's later pieces still wrap where they
        must: they come after it is drawn). Piped output is never changed."""
        plain, width = text.plain, self.console.width
        if plain.startswith(" ") and "\n" not in plain and 0 < self.column and self.column + cell_len(plain) > width:
            text = Text("\n") + text[1:]
            plain = text.plain
        tail = plain.rsplit("\n", 1)
        self.column = cell_len(tail[-1]) + (self.column if len(tail) == 1 else 0)
        if width and self.column > width:
            self.column %= width  # the terminal wrapped inside the piece
        return text

    def _rejected(self, event: Rejected) -> None:
        if not self.show_rejected or not event.text:
            return
        self.close_mark()
        if self.color:
            self._write(Text(visible(event.text), style=REJECTED_STYLE))
        else:
            self._write(Text(f"~~{visible(event.text)}~~"))

    def _end_reply(self, done: ReplyDone) -> None:
        self.close_mark()
        line = stats_line(done.stats, done.stop_reason)
        if self.notes is not None:  # the reply's text stays whole where it goes; what is said of it, apart
            self.newline()
            mark = CUT_MARKS.get(done.stop_reason, "")
            width = self.notes.width if self.notes.is_terminal else 0
            said = fit_to_width(f"{mark} · {line.strip()}" if mark else line.strip(), width)
            self.notes.print(Text(said), soft_wrap=True)
            return
        if done.stop_reason in CUT_MARKS:
            self._write(Text(" " + CUT_MARKS[done.stop_reason], style="bold yellow" if self.color else ""))
        self.newline()
        width = self.console.width if self.console.is_terminal else 0
        self.console.print(fit_to_width(line, width), style=NOTE_STYLE if self.color else "", soft_wrap=True)

    def newline(self) -> None:
        self.close_mark()
        self._stop_waiting()
        if not self.at_line_start:
            self.console.print()
            self.at_line_start = True
        self.column = 0

    # ----- messages ----------------------------------------------------------------------------
    def note(self, message: str) -> None:
        self.newline()
        if self.notes is not None:  # a pipe: what is said of the reply stays off its text
            self.notes.print(Text(visible(message)), soft_wrap=True)
            return
        self.console.print(Text(visible(message), style=NOTE_STYLE if self.color else ""), soft_wrap=True)

    def info(self, message: Any) -> None:
        self.newline()
        self.console.print(message if not isinstance(message, str) else Text(visible(message)))

    def error(self, message: str) -> None:
        self.newline()
        self.console.print(Text(visible(message), style=ERROR_STYLE if self.color else ""), soft_wrap=True)


def token_style(token: Token) -> str:
    """The colour of a token's origin: a copy from the chat apart from the drafter model's drafts."""
    copied = token.origin == Origin.DRAFTED and token.source == "lookup"
    return COPIED_STYLE if copied else STYLES[token.origin]


def coloured_tokens(tokens) -> Text:
    """A reply's tokens as one text, each in its origin's colour (a console without colour drops them)."""
    text = Text()
    for token in tokens:
        text.append(visible(token.text), style=token_style(token))
    return text


# ----- one-line texts ------------------------------------------------------------------------------
def gamma_text(gamma: Gamma, mean_gamma: float | None = None) -> str:
    """`4`, `auto`, or `auto (≈3.2)` where a reply measured its mean draft."""
    shown = show_value("speculation.gamma", gamma)
    return f"{shown} (≈{mean_gamma:.1f})" if mean_gamma and not isinstance(gamma, int) else shown


def prefill_text(event: PrefillProgress) -> str:
    """`reading prompt 1,536 / 4,102 tokens · 212 tok/s`"""
    return f"reading prompt {event.done:,} / {event.total:,} tokens · {event.tokens_per_s:.0f} tok/s"


def stats_line(stats: ReplyStats, stop_reason: str = "eos", speedup: float | None = None) -> str:
    """` 96 tok · 9.8 tok/s · ttft 0.31 s · prompt 30 tok in 0.05 s (600 tok/s) · accepted 71/88 drafts (81%) ·
    3.4 tok/step · γ 4`: tok/s is the generation rate, the prompt's reading (when it read one) is apart."""
    parts = [f" {stats.new_tokens} tok", f"{stats.generation_tokens_per_s:.1f} tok/s", f"ttft {stats.ttft_s:.2f} s"]
    if stats.prefill_tokens:
        parts.append(prompt_text(stats))
    if stats.mode == Mode.SPEC:
        parts.append(f"accepted {stats.accepted}/{stats.drafted} drafts ({stats.acceptance_rate:.0%})")
        parts.append(f"{stats.tokens_per_step:.1f} tok/step")
        parts.append(f"γ {gamma_text(stats.gamma, stats.mean_gamma)}")
        if stats.drafter == "auto" and stats.copied_steps:
            parts.append(step_split(stats))
        elif stats.drafter not in ("", "auto", "model"):
            parts.append(f"{stats.drafter} drafter")
    else:
        parts.append(f"{stats.mode} only")
    if speedup is not None:
        parts.append(f"{speedup:.1f}× vs target")
    if stop_reason == "cancelled":
        parts.append("cancelled")
    elif stop_reason == "max_tokens":
        parts.append("hit max tokens (/max)")
    elif stop_reason == CONTEXT_FULL:
        parts.append("context window full")
    return " · ".join(parts)


SEPARATOR = " · "


def fit_to_width(line: str, width: int) -> str:
    """A ` · `-separated line broken into lines of at most `width` cells at its separators, never inside a part
    (a word or a number); continuation lines start with a space. width 0 (a pipe): the line as it is."""
    if width <= 0 or cell_len(line) <= width:
        return line
    lines, current = [], ""
    for part in line.split(SEPARATOR):
        joined = f"{current}{SEPARATOR}{part}" if current else part
        if current and cell_len(joined) > width:
            lines.append(current)
            joined = " " + part.lstrip()
        current = joined
    return "\n".join([*lines, current])


def step_split(stats: ReplyStats) -> str:
    """`steps 66 copied, 1 model, 7 target-only`: who drafted each of the reply's target steps."""
    return f"steps {stats.copied_steps} copied, {stats.model_steps} model, {stats.target_only_steps} target-only"


def time_split(stats: ReplyStats) -> str:
    """`reading 1.20 s · copies 1.10 s · model drafts 0.40 s · target-only 0.30 s`: where a reply's time went."""
    parts = [("reading", stats.prefill_s), ("copies", stats.copy_s), ("model drafts", stats.model_s)]
    parts.append(("target-only", stats.target_only_s))
    return " · ".join(f"{name} {seconds:.2f} s" for name, seconds in parts)


def prompt_text(stats: ReplyStats) -> str:
    """`prompt 4,102 tok in 19.3 s (213 tok/s)`, and `, 1,960 more cached` when part of it was cached (the last
    turn's, or on the first the warm-up's system prompt)."""
    rate = f"{stats.prefill_tokens_per_s:,.0f} tok/s" if stats.prefill_s > 0 else ""
    cached = f"{stats.reused_tokens:,} more cached" if stats.reused_tokens else ""
    detail = ", ".join(part for part in (rate, cached) if part)
    seconds = f"{stats.prefill_s:.1f}" if stats.prefill_s >= 1 else f"{stats.prefill_s:.2f}"
    return f"prompt {stats.prefill_tokens:,} tok in {seconds} s" + (f" ({detail})" if detail else "")


def legend(mode: Mode, color: bool, show_rejected: bool = False, marks: bool = True) -> Text:
    """Every origin the mode can show, in its colour, or (colour off) in its brackets; unmarked: the rest."""
    text = Text("legend: ")
    for origin in MODE_ORIGINS[mode]:
        opening, closing = MARKS.get(origin, ("", "")) if marks and not color else ("", "")
        label = LABELS[origin] + (" step" if origin == Origin.TARGET and mode == Mode.SPEC else "")
        unmarked = " (unmarked)" if marks and not color and not opening else ""
        text.append(opening + label + closing + unmarked, style=STYLES[origin] if color else "")
        text.append("  ")
        if origin == Origin.DRAFTED and color:  # copies are drafts too: brackets do not tell them apart
            text.append("copied+accepted", style=COPIED_STYLE)
            text.append("  ")
    if show_rejected and mode == Mode.SPEC:
        text.append("rejected" if color else "~~rejected~~", style=REJECTED_STYLE if color else "")
        text.append("  ")
    text.append(" /help for commands", style=NOTE_STYLE if color else "")
    return text


class Legend:
    """The legend as the console it is drawn on can show it: in colour, or with the brackets of plain mode."""

    def __init__(self, mode: Mode, show_rejected: bool = False, marks: bool = True):
        self.mode, self.show_rejected, self.marks = mode, show_rejected, marks

    def __rich_console__(self, console: Console, options):
        yield legend(self.mode, console.color_system is not None, self.show_rejected, self.marks)


def weights_text(facts) -> str:
    """How the weights are held: a GGUF type converted to a dtype, or quantized after loading."""
    quantization = facts.quantization
    if quantization in ("", "none"):
        return facts.dtype
    if quantization.rsplit("→", 1)[-1] in QUANTIZATIONS:  # quantized at load: compute runs in dtype
        return f"{quantization} weights, {facts.dtype} compute"
    return f"{quantization}→{facts.dtype}"


def model_facts_text(role: str, facts) -> str:
    quant = weights_text(facts)
    kernel = f", kernel {facts.kernel}" if getattr(facts, "kernel", "") else ""
    return (
        f"{role} {visible(facts.name)} ({_human(facts.params)} params, {quant}, {facts.device}, "
        f"{facts.backend} forward{kernel}, {facts.memory_bytes / 2**30:.2f} GiB, loaded in {facts.load_s:.1f} s)"
    )


def banner(pair, drafter: str = "model", expected: str = "") -> Text:
    """The models, and who drafts (`drafter` is speculation.drafter); `expected`: the pair's measured cost line."""
    text = Text("specchat", style="bold")
    text.append(" · " + model_facts_text("target", pair.target_facts))
    if getattr(pair.target_facts, "template", "own") == "plain":
        text.append("\n         · the tokenizer has no chat template: using plain User:/Assistant: turns")
    head = getattr(pair.target_facts, "draft_head", "")
    if head:  # loading/draft_head.py
        drafts = "it drafts" if drafter == "head" else "/drafter head drafts with it"
        text.append(f"\n         · {visible(head)}: {drafts}")
    if drafter == "lookup":
        text.append("\n         · drafter: prompt lookup, no model (/drafter switches)")
    elif pair.drafter_facts is not None:
        text.append("\n         · " + model_facts_text("drafter", pair.drafter_facts))
        if getattr(pair, "pair_check", None) is not None:  # loading/pair_check.py's verdict
            text.append("\n         · " + visible(pair.pair_check.line()))
        if expected:  # session/pair_cost.py
            text.append("\n         · " + expected)
        if drafter == "auto":
            text.append(
                "\n         · drafts: a copy from the chat where a match yields more than the drafter, else the drafter"
            )
    else:
        text.append("\n         · no drafter model (target-only, or /drafter lookup)")
    return text


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def as_table(rows: list[tuple[str, str]], headers: tuple[str, str], title: str | None = None) -> Table:
    table = Table(title=title, show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column(headers[0], style="cyan", no_wrap=True)
    table.add_column(headers[1], overflow="fold")
    for left, right in rows:
        table.add_row(Text(visible(left)), Text(visible(right)))  # user and model text: never markup, no controls
    return table


def group(*items) -> Group:
    return Group(*items)
