"""How loading reports progress: progress(message, fraction), fraction None while the length is unknown."""
from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, "float | None"], None]


def report(progress: Progress | None, message: str, fraction: float | None) -> None:
    """Call `progress` when there is one."""
    if progress is not None:
        progress(message, fraction)
