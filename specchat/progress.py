"""How loading reports progress: progress(message, fraction), fraction None while the length is unknown."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str, "float | None"], None]


def report(progress: Progress | None, message: str, fraction: float | None) -> None:
    """Call `progress` when there is one."""
    if progress is not None:
        progress(message, fraction)


def each_message_once(show: Callable[[str], None]) -> Progress:
    """A progress callback for a plain stream: show(message) for each new message, once (a long step
    reports the same message with a growing fraction)."""
    last = [None]

    def progress(message: str, _fraction: float | None = None) -> None:
        if message != last[0]:
            show(message)
            last[0] = message

    return progress


def to_stderr() -> Progress:
    """Each new message on its own line of standard error (the bench tools' progress, apart from their results)."""
    return each_message_once(lambda message: print(message, file=sys.stderr, flush=True))
