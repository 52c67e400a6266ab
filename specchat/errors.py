"""The one error type model loading raises: its message is one line for the user, never a traceback."""

from __future__ import annotations


class ModelLoadError(Exception):
    """A model or model pair cannot be loaded; str(err) is one line saying why and what to do."""


def one_line(err: BaseException, limit: int = 240) -> str:
    """The first meaningful line of an exception's message, shortened for a status line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
