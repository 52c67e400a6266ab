"""`python infer.py [--config FILE] [--prompt TEXT] [--json] [--no-color] [--marks] [--system TEXT] [--max N|off]
[section.key=value ...]`

Parses arguments, loads the model pair with a progress bar, then runs the chat (or one reply).
Every error a user can cause ends in one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import TextIO

from specchat.config import Config, ConfigError
from specchat.errors import ModelLoadError
from specchat.launch import CompareFactory, Loader, prepare, read_pair_config
from specchat.loading.models import load_pair
from specchat.options import UsageError
from specchat.safe_text import json_text, visible
from specchat.session.chat import ChatError, ChatSession, CompareFn
from specchat.settings import set_from_text, with_value
from specchat.speculative.events import ReplyDone, Token
from specchat.speculative.sampling import NoLawError
from specchat.tui import render
from specchat.tui.arguments import build_parser
from specchat.tui.commands import build_registry
from specchat.tui.exits import Terminated, leave_on_signals, silence_lost_terminal
from specchat.tui.repl import Repl, history_path, open_history, sigint_sets


def default_compare(pair) -> CompareFn:
    """Compare mode's reruns on their own caches, drawn side by side (specchat.session.compare)."""
    from specchat.session.compare import Comparer
    from specchat.tui.compare_view import view_compare_fn

    return view_compare_fn(Comparer(pair))


USER_ERRORS = (UsageError, ConfigError, ChatError, ModelLoadError, NoLawError)  # one line, no traceback


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
