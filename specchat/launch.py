"""What the chat (`specchat`) and the server (`specchat serve`) share before either runs: the command-line options
that name the pair, the config they make, and the pair's loading, session and warm-up under one progress display.

Errors a user can cause here are one line: ConfigError, ModelLoadError (the options' UsageError: options.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from specchat.config import Config, ConfigError, Mode
from specchat.loading.models import LoadedPair, reply_stops
from specchat.progress import Notice, each_message_once
from specchat.progress import Progress as ReportFn
from specchat.safe_text import visible
from specchat.session.chat import ChatSession, CompareFn
from specchat.session.warm_up import warm_up
from specchat.settings import load_config, set_from_text
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.engine import Engine

Loader = Callable[[Config, ReportFn], LoadedPair]  # specchat.loading.models.load_pair, or a test's stand-in
CompareFactory = Callable[[LoadedPair], CompareFn]  # what runs compare mode beside a session on the pair


def read_pair_config(args) -> Config:
    """The config as add_pair_options' options make it."""
    cfg = load_config(args.config, args.overrides)
    for flag, key in ((args.target, "target.source"), (args.drafter, "drafter.source")):
        if flag is not None:
            cfg = set_from_text(cfg, key, flag)
    if args.system is not None:
        cfg = set_from_text(cfg, "ui.system_prompt", args.system)
    return cfg


STEP_LINE_FROM_S = 2.0  # a loading step that took this long stays on screen, with its time, once it is done


class StepBar:
    """The loading bar, one step at a time: each new message is a step with its own bar and elapsed time;
    a finished step that took STEP_LINE_FROM_S or more stays above the bar as `✓ message · 12.3 s`."""

    def __init__(self, progress: Progress, clock: Callable[[], float] = time.perf_counter):
        self.progress, self.clock = progress, clock
        self.task, self.message, self.started = None, "", 0.0

    def report(self, message: str, fraction: float | None = None) -> None:
        if isinstance(message, Notice):  # a line that stays, above the current step's bar
            self.progress.console.print(Text(f"! {visible(message)}", style="yellow"))
            return
        if message != self.message:
            self.finish()
            self.message, self.started = message, self.clock()
            self.task = self.progress.add_task(visible(message), total=None)
        self.progress.update(self.task, total=None if fraction is None else 1.0, completed=fraction or 0.0)

    def finish(self) -> None:
        """End the current step (its line stays when it was slow)."""
        if self.task is None:
            return
        took = self.clock() - self.started
        self.progress.remove_task(self.task)
        if took >= STEP_LINE_FROM_S:
            self.progress.console.print(Text(f"✓ {visible(self.message)} · {took:.1f} s", style="dim"))
        self.task = None


def make_console(color: bool, file: TextIO | None = None) -> Console:
    """A rich Console on `file` (stdout): forced colour, or none (100 columns wide when not a terminal)."""
    file = file or sys.stdout
    if color:
        return Console(file=file, highlight=False, emoji=False, force_terminal=True)
    is_tty = bool(getattr(file, "isatty", lambda: False)())
    return Console(file=file, highlight=False, emoji=False, color_system=None, width=None if is_tty else 100)


def with_progress(console: Console, work: Callable, clock: Callable[[], float] = time.perf_counter):
    """Run work(report) while drawing its report(message, fraction|None) calls as a bar per step, named by the
    step's message (assembling, compiling the kernel, quantizing, warming up).

    When the console is not a terminal, each distinct message is written once as a plain line. A message
    may name a file or a model: it is shown through safe_text.visible, never as markup.
    """
    if not console.is_terminal:
        return work(each_message_once(lambda message: console.print(Text(visible(message)), soft_wrap=True)))
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        steps = StepBar(progress, clock)
        steps.report("starting", None)
        result = work(steps.report)
        steps.finish()
        return result


def prepare(cfg: Config, load: Loader, compare: CompareFactory | None, console: Console):
    """Load the pair, start the session and warm the models up, all under one progress display."""

    def work(report):
        pair = load(cfg, report)
        session = start_session(cfg, pair, compare)
        report("warming up the models", None)
        return pair, session, warm_up(session)

    return with_progress(console, work)


def start_session(cfg, pair, compare: CompareFactory | None) -> ChatSession:
    problem = drafter_needed(
        pair.drafter is not None, cfg.speculation.mode, cfg.speculation.compare, cfg.speculation.drafter
    )
    if problem:
        raise ConfigError(
            f"{problem}, but none was loaded; set drafter.source, speculation.drafter=lookup or speculation.mode=target"
        )
    engine = Engine.for_pair(pair)
    problem = engine.drafter_problem(cfg.speculation.drafter) if cfg.speculation.mode == Mode.SPEC else None
    if problem:
        raise ConfigError(f"speculation.drafter: {problem}")
    return ChatSession(
        engine,
        pair.tokenizer,
        cfg,
        pair.context_limit,
        compare_fn=compare(pair) if compare else None,
        stop_strings=reply_stops(pair.target_facts),
    )
