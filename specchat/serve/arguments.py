"""`specchat serve`'s command line (serve/cli.py runs it). Imports no torch: `--help` answers at once (entry.py)."""

from __future__ import annotations

import argparse

from specchat.options import OneLineParser, add_pair_options
from specchat.serve.limits import MAX_TOKENS, MAX_WAITING

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
