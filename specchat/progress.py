"""How loading reports progress: progress(message, fraction), fraction None while the length is unknown."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str, "float | None"], None]


class Notice(str):
    """A message the user must see after loading (a fallback, a slower path, a rebuilt file, weights changed):
    a terminal's loading bar keeps it on screen as a line of its own, where a step's message goes when done."""


def report(progress: Progress | None, message: str, fraction: float | None) -> None:
    """Call `progress` when there is one."""
    if progress is not None:
        progress(message, fraction)


def notify(progress: Progress | None, message: str) -> None:
    """Report `message` as a Notice."""
    report(progress, Notice(message), None)


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
