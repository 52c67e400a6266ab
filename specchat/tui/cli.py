"""`python infer.py [--config FILE] [--prompt TEXT] [--json] [--no-color] [--marks] [--system TEXT] [--max N|off]
[section.key=value ...]`

Parses arguments, loads the model pair with a progress bar, then runs the chat (or one reply).
Every error a user can cause ends in one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from specchat.config import Config, ConfigError, Mode, drafter_needed, load_config, set_from_text, with_value
from specchat.errors import ModelLoadError
from specchat.loading.models import LoadedPair, load_pair, reply_stops
from specchat.progress import Notice, each_message_once
from specchat.progress import Progress as ReportFn
from specchat.session.chat import ChatError, ChatSession, CompareFn
from specchat.session.warm_up import warm_up
from specchat.speculative.engine import Engine
from specchat.speculative.events import ReplyDone, Token
from specchat.speculative.sampling import NoLawError
from specchat.tui import render
from specchat.tui.commands import build_registry
from specchat.tui.exits import Terminated, leave_on_signals, silence_lost_terminal
from specchat.tui.repl import Repl, history_path, open_history, sigint_sets
from specchat.tui.safe_text import json_text, visible

Loader = Callable[[Config, ReportFn], LoadedPair]  # specchat.loading.models.load_pair, or a test's stand-in
CompareFactory = Callable[[LoadedPair], CompareFn]  # what runs compare mode beside a session on the pair


EXAMPLES = """examples:
  specchat                                   chat with the bundled pair (/help lists commands)
  specchat speculation.gamma=6 sampling.temperature=0.7
  specchat --prompt "reverse a list in python" --json
  specchat --target Qwen2.5-7B-Q4_K_M.gguf --drafter Qwen2.5-0.5B-Q4_K_M.gguf   your own pair
  echo "hello" | specchat > reply.txt         the reply's text alone; its stats line goes to stderr
config keys: see /config inside the chat, or specchat/configs/default.toml"""


class UsageError(Exception):
    """Bad command-line arguments."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (try --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specchat",
        description="Terminal chat with exact speculative decoding.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pair_options(parser)
    parser.add_argument(
        "--prompt", metavar="TEXT", help="answer one prompt and exit (- reads it from stdin; piped stdin works too)"
    )
    parser.add_argument("--json", action="store_true", help="one-shot output as one JSON object")
    parser.add_argument("--no-color", action="store_true", help="plain text, no colours")
    parser.add_argument(
        "--marks",
        action="store_true",
        help="bracket each token's origin (⟦drafted⟧) even when stdout is not a terminal",
    )
    parser.add_argument(
        "--max",
        metavar="N",
        help="most new tokens per reply, or off (sampling.max_new_tokens; default off: to the end of the turn)",
    )
    return parser


def add_pair_options(parser: argparse.ArgumentParser) -> None:
    """The options the chat and `specchat serve` share: the config, the pair, the system prompt, overrides."""
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: the bundled pair)")
    parser.add_argument(
        "--target", metavar="SOURCE", help="the target model: a .gguf file, a folder, bundled:NAME (target.source)"
    )
    parser.add_argument("--drafter", metavar="SOURCE", help="the drafter model, as --target (drafter.source)")
    parser.add_argument("--system", metavar="TEXT", help="the system prompt (ui.system_prompt)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")


def default_compare(pair) -> CompareFn:
    """Compare mode's reruns on their own caches, drawn side by side (specchat.session.compare)."""
    from specchat.session.compare import Comparer
    from specchat.tui.compare_view import view_compare_fn

    return view_compare_fn(Comparer(pair))


USER_ERRORS = (UsageError, ConfigError, ChatError, ModelLoadError, NoLawError)  # one line, no traceback


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


def read_pair_config(args) -> Config:
    """The config as add_pair_options' options make it."""
    cfg = load_config(args.config, args.overrides)
    for flag, key in ((args.target, "target.source"), (args.drafter, "drafter.source")):
        if flag is not None:
            cfg = set_from_text(cfg, key, flag)
    if args.system is not None:
        cfg = set_from_text(cfg, "ui.system_prompt", args.system)
    return cfg


def read_config(args) -> Config:
    cfg = read_pair_config(args)
    if args.max is not None:
        cfg = set_from_text(cfg, "sampling.max_new_tokens", args.max)
    if args.no_color:
        cfg = with_value(cfg, "ui.color", False)
    return cfg


def one_shot_text(args, stdin: TextIO) -> str | None:
    """The one-shot prompt: --prompt (`--prompt -`: read stdin), or stdin when it is not a terminal; None means
    interactive."""
    if args.prompt == "-":
        text = stdin.read()
    elif args.prompt is not None:
        text = args.prompt
    elif not stdin.isatty():
        text = stdin.read()
    elif args.json:
        raise UsageError("--json answers one prompt: give --prompt TEXT or pipe the text to stdin")
    else:
        return None
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text.strip()


def run_once(session: ChatSession, text: str, renderer: render.Renderer, as_json: bool, out: TextIO) -> int:
    """Answer one prompt: a streamed reply and its stats line, or one JSON object."""
    done, tokens = None, []
    with sigint_sets(threading.Event()) as cancel:
        if not as_json:
            renderer.begin_reply()
        for event in session.reply(text, cancel):
            if isinstance(event, Token):
                tokens.append(event)
            done = event if isinstance(event, ReplyDone) else done
            if not as_json:
                renderer.event(event)
    if as_json:  # exact text, every control character escaped: safe on a terminal too
        out.write(
            json_text(
                {
                    "prompt_ids": session.last_prompt_ids,
                    "text": done.text,
                    "tokens": [{"id": t.id, "text": t.text, "origin": t.origin.value} for t in tokens],
                    "stop_reason": done.stop_reason,
                    "stats": done.stats.to_dict(),
                }
            )
            + "\n"
        )
    return 0


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


def _on_command_line(args, key: str) -> bool:
    """Whether `key` was set on the command line (key=value), not only by default or in a config file."""
    return any(override.partition("=")[0].strip() == key for override in args.overrides or [])


def run(args, load: Loader, compare: CompareFactory | None, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    cfg = read_config(args)
    prompt = one_shot_text(args, stdin)
    color = render.color_wanted(cfg.ui.color, stdout)
    status = render.make_console(render.color_wanted(cfg.ui.color, stderr), stderr)
    console = render.make_console(color, stdout)
    piped = not console.is_terminal  # the reply's text alone on stdout: no marks unless asked, notes to stderr
    marks = cfg.ui.origin_marks and (not piped or args.marks or _on_command_line(args, "ui.origin_marks"))
    renderer = render.Renderer(console, cfg.ui.show_rejected, marks, notes=status if piped else None)
    pair, session, cost = prepare(cfg, load, compare, status)
    if prompt is not None:
        return run_once(session, prompt, renderer, args.json, stdout)
    renderer.info(render.banner(pair, cfg.speculation.drafter, cost.line() if cost else ""))
    renderer.info(render.Legend(cfg.speculation.mode, cfg.ui.show_rejected, cfg.ui.origin_marks))
    history, problem = open_history(history_path())
    if problem:
        renderer.note(problem)
    return Repl(session, build_registry(), renderer, history).run()


def main(
    argv: list[str] | None = None,
    load: Loader = load_pair,
    compare: CompareFactory | None = default_compare,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Entry point of `python infer.py` and the `specchat` script; returns the exit status."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    try:
        args = build_parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
        with leave_on_signals():
            return run(args, load, compare, stdin, stdout, stderr)
    except USER_ERRORS as err:
        stderr.write(f"specchat: error: {visible(str(err))}\n")  # it may quote a file's or a model's text
        return 2 if isinstance(err, (UsageError, ConfigError)) else 1
    except KeyboardInterrupt:
        stderr.write("specchat: interrupted\n")
        return 130
    except Terminated as signalled:  # SIGTERM, or SIGHUP when the terminal closed: leave as Ctrl-D does
        if signalled.signum == signal.SIGHUP:
            silence_lost_terminal()
        return signalled.exit_status
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
