"""`specchat serve [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--queue N] [--config FILE] [--target SOURCE]
[--drafter SOURCE] [section.key=value ...]`: load the pair once, as the chat does, then answer OpenAI-style requests
until Ctrl-C or SIGTERM. Every error a user can cause before it listens ends in one line and a non-zero status.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from typing import TextIO

from specchat.config import ConfigError, set_from_text
from specchat.errors import ModelLoadError
from specchat.serve.app import MAX_BODY, Settings, build_app
from specchat.serve.service import MAX_WAITING, Service
from specchat.tui.cli import OneLineParser, UsageError, add_pair_options, prepare, read_pair_config
from specchat.tui.render import make_console
from specchat.tui.safe_text import visible

API_KEY_VARIABLE = "SPECCHAT_API_KEY"
EXAMPLES = """examples:
  specchat serve                                      the bundled pair on http://127.0.0.1:8080/v1
  specchat serve --port 9000 --api-key secret speculation.gamma=auto
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
    add_pair_options(parser)  # --system: for a chat that brings no system message
    return parser


def check(args) -> None:
    """The options, and that the address can be listened on, before the models load."""
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be from 1 to 65535, got {args.port}")
    if args.queue < 1:
        raise UsageError(f"--queue must be at least 1, got {args.queue}")
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
        session.engine, session.tokenizer, cfg.ui.system_prompt, session.context_limit, session.stop_strings, args.queue
    )
    name = pair.target_facts.name
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE, "")
    app = build_app(service, Settings(name, cfg, api_key, MAX_BODY))
    stderr.write(
        f"specchat serve: {visible(name)} on http://{args.host}:{args.port}/v1"
        f"{' (API key required)' if api_key else ''}; Ctrl-C stops\n"
    )
    stderr.flush()
    if run is None:
        import uvicorn

        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    else:
        run(app, args.host, args.port)
    return 0


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
