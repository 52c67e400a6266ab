"""The command-line options the chat (`specchat`) and the server (`specchat serve`) share, and their parser's way
with a mistake (one line, UsageError). Standard library only: `--help` answers before torch is imported (entry.py).
"""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad command-line arguments."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{message} (try --help)")


def add_pair_options(parser: argparse.ArgumentParser) -> None:
    """The options the chat and `specchat serve` share: the config, the pair, the system prompt, overrides."""
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: the bundled pair)")
    parser.add_argument(
        "--target", metavar="SOURCE", help="the target model: a .gguf file, a folder, bundled:NAME (target.source)"
    )
    parser.add_argument("--drafter", metavar="SOURCE", help="the drafter model, as --target (drafter.source)")
    parser.add_argument("--system", metavar="TEXT", help="the system prompt (ui.system_prompt)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
