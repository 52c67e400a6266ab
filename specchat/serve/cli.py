"""`specchat serve [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--queue N] [--max-tokens N] [--allow-host NAME]
[--cors ORIGIN] [--config FILE] [--target SOURCE] [--drafter SOURCE] [section.key=value ...]`: load the pair once, as
the chat does, then answer OpenAI-style requests until Ctrl-C or SIGTERM, which end the running reply after its step
in flight (its finish reason and [DONE] sent) and exit. Every error a user can cause before it listens ends in one
line and a non-zero status.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO

from specchat.config import ConfigError
from specchat.errors import ModelLoadError
from specchat.launch import OneLineParser, UsageError, add_pair_options, make_console, prepare, read_pair_config
from specchat.safe_text import visible
from specchat.serve.access_log import to_stderr
from specchat.serve.app import MAX_BODY, Settings, build_app
from specchat.serve.guard import Guard
from specchat.serve.service import MAX_TOKENS, MAX_WAITING, Service
from specchat.settings import set_from_text

API_KEY_VARIABLE = "SPECCHAT_API_KEY"
EXAMPLES = """examples:
  specchat serve                                      the bundled pair on http://127.0.0.1:8080/v1
  specchat serve --port 9000 --api-key secret speculation.gamma=auto
  specchat serve --cors http://localhost:5173          a web page of your own may call it
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Say hello."}]}'
the API key may come from $SPECCHAT_API_KEY instead of --api-key."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="specchat serve",
        description="The chat's exact speculative decoding behind an OpenAI-compatible HTTP server.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--api-key", metavar="KEY", help=f"ask every request for this key (or set ${API_KEY_VARIABLE})")
    parser.add_argument(
        "--queue",
        type=int,
        default=MAX_WAITING,
        metavar="N",
        help=f"requests admitted at once, one running (default {MAX_WAITING})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        metavar="N",
        help=f"most new tokens of a reply whose request sets no max_tokens (default {MAX_TOKENS})",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer beside loopback names, IP addresses and --host (repeatable; * any)",
    )
    parser.add_argument(
        "--cors",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (http://localhost:5173) whose requests are answered; others are refused (repeatable)",
    )
    add_pair_options(parser)  # --system: for a chat that brings no system message
    return parser


def check(args) -> None:
    """The options, and that the address can be listened on, before the models load."""
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be from 1 to 65535, got {args.port}")
    if args.queue < 1:
        raise UsageError(f"--queue must be at least 1, got {args.queue}")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    try:
        socket.create_server((args.host, args.port)).close()
    except OSError as err:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None


def serve(args, load: Callable, stderr: TextIO, run: Callable | None = None) -> int:
    check(args)
    cfg = set_from_text(read_pair_config(args), "speculation.compare", "off")
    status = make_console(False, stderr)
    pair, session, _ = prepare(cfg, load, None, status)
    service = Service(
        session.engine,
        session.tokenizer,
        cfg.ui.system_prompt,
        session.context_limit,
        session.stop_strings,
        args.queue,
        args.max_tokens,
    )
    name = pair.target_facts.name
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE, "")
    guard = Guard.of(args.host, args.allow_host, args.cors)
    app = build_app(service, Settings(name, cfg, api_key, MAX_BODY, guard, to_stderr))
    stderr.write(
        f"specchat serve: {visible(name)} on http://{args.host}:{args.port}/v1"
        f"{' (API key required)' if api_key else ''}; Ctrl-C stops\n"
    )
    stderr.flush()
    if run is not None:
        run(app, args.host, args.port)
        return 0
    run_until_signalled(app, args.host, args.port)
    leave_now()  # the replies are done and nothing is left to write: skip tearing down gigabytes of weights


def leave_now() -> NoReturn:
    """Exit 0 at once, its output flushed: an interpreter's teardown of a loaded pair takes seconds (3 s for the
    bundled pair) and does nothing a stopped server needs."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def run_until_signalled(app, host: str, port: int) -> None:
    """uvicorn until SIGINT or SIGTERM: the running replies end after their step in flight, each with its finish
    reason and [DONE], the server closes, and the reply threads are waited for (a process that exits while one is
    inside torch aborts). Being stopped is how a server ends: no signal is raised again after it (status 0); a
    second Ctrl-C forces the close."""
    import contextlib
    import signal

    import uvicorn

    service = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            service.stop_all()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            handled = (signal.SIGINT, signal.SIGTERM)
            before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_S)
    try:
        Server(config).run()
    finally:
        service.stop_all()
        service.wait_idle(SHUTDOWN_S)


SHUTDOWN_S = 2  # what a stopping server waits for its replies' last steps


def main(argv: list[str] | None = None, load: Callable | None = None, stderr: TextIO | None = None) -> int:
    """`specchat serve ...`; returns the exit status."""
    stderr = stderr or sys.stderr
    if load is None:
        from specchat.loading.models import load_pair

        load = load_pair
    try:
        args = build_parser().parse_args(sys.argv[2:] if argv is None else argv)
        return serve(args, load, stderr)
    except (UsageError, ConfigError, ModelLoadError) as err:
        stderr.write(f"specchat serve: error: {visible(str(err))}\n")
        return 2 if isinstance(err, (UsageError, ConfigError)) else 1
    except KeyboardInterrupt:
        return 130
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
