"""`specchat` and `python infer.py`: the chat (tui/cli.py); with `serve` first, the server (serve/cli.py); with
`train-drafter` first, a draft head's training (training/cli.py)."""

from __future__ import annotations

import gc
import sys
from typing import NoReturn

from specchat import early_pages
from specchat.threads import set_wait_policy

HELP = ("-h", "--help")


def run() -> NoReturn:
    """The program (`python infer.py`, the `specchat` command): main() on the command line, then an exit whose
    interpreter teardown does not collect what the run made (gc.freeze: its passes over a loaded pair's objects
    took 1.7 of the 2.1 s between a reply's end and the exit, Zen 3); atexit handlers and flushing run as ever."""
    code = main()
    gc.freeze()
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    set_wait_policy()  # before the chat or the server loads torch (threads.py)
    helped = quick_help(argv)
    if helped is not None:
        return helped
    if argv[:1] != ["train-drafter"]:
        early_pages.start(argv)  # the tiles' fresh pages faulted in while the imports below run (early_pages.py)
    if argv[:1] == ["serve"]:
        from specchat.serve.cli import main as serve

        return serve(argv[1:])
    if argv[:1] == ["train-drafter"]:
        from specchat.training.cli import main as train_drafter

        return train_drafter(argv[1:])
    from specchat.tui.cli import main as chat

    return chat(argv)


def quick_help(argv: list[str]) -> int | None:
    """The chat's or the server's --help from its parser alone, before torch and the models' code are imported (a
    second, not ten); None where the arguments ask no help (or are wrong: the command's own run says how)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    if not any(option in HELP for option in options) or argv[:1] == ["train-drafter"]:
        return None
    from specchat.options import UsageError

    if argv[:1] == ["serve"]:
        from specchat.serve.arguments import build_parser as serve_parser

        parse, rest = serve_parser().parse_args, argv[1:]
    else:
        from specchat.tui.arguments import build_parser as chat_parser

        parse, rest = chat_parser().parse_intermixed_args, argv
    try:
        parse(rest)
    except SystemExit as done:  # the help, printed
        return done.code if isinstance(done.code, int) else 0
    except UsageError:
        return None
    return None
