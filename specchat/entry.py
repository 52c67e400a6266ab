"""`specchat` and `python infer.py`: the chat (tui/cli.py); with `serve` first, the server (serve/cli.py); with
`train-drafter` first, a draft head's training (training/cli.py)."""

from __future__ import annotations

import sys

from specchat.threads import set_wait_policy


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    set_wait_policy()  # before the chat or the server loads torch (threads.py)
    if argv[:1] == ["serve"]:
        from specchat.serve.cli import main as serve

        return serve(argv[1:])
    if argv[:1] == ["train-drafter"]:
        from specchat.training.cli import main as train_drafter

        return train_drafter(argv[1:])
    from specchat.tui.cli import main as chat

    return chat(argv)
