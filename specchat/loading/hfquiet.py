"""Silence transformers' own progress bars and warnings while a model loads (specchat reports progress)."""
from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator

from transformers.utils import logging as hf_logging


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class BarsToProgress(io.TextIOBase):
    """A stand-in stderr that turns tqdm bars ("...| 12/339 [...") into progress(message, fraction)."""

    BAR = re.compile(r"(\d+)/(\d+) \[")

    def __init__(self, progress, message: str):
        super().__init__()
        self.progress = progress
        self.message = message

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        found = self.BAR.findall(text)
        if found and self.progress is not None:
            done, total = (int(n) for n in found[-1])
            self.progress(self.message, done / total if total else None)
        return len(text)
