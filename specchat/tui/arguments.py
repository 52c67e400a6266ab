"""The chat's command line: `python infer.py [--config FILE] [--prompt TEXT] [--json] [--no-color] [--marks]
[--system TEXT] [--max N|off] [section.key=value ...]` (tui/cli.py runs it). Imports no torch: `--help` answers at
once (entry.py).
"""

from __future__ import annotations

import argparse

from specchat.options import OneLineParser, add_pair_options

EXAMPLES = """examples:
  specchat                                   chat with the bundled pair (/help lists commands)
  specchat speculation.gamma=6 sampling.temperature=0.7
  specchat --prompt "reverse a list in python" --json
  specchat --target Qwen2.5-7B-Q4_K_M.gguf --drafter Qwen2.5-0.5B-Q4_K_M.gguf   your own pair
  echo "hello" | specchat > reply.txt         the reply's text alone; its stats line goes to stderr
config keys: see /config inside the chat, or specchat/configs/default.toml"""


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
