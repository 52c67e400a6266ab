"""Silence transformers' own progress bars and warnings while a model loads (specchat reports progress)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator

from transformers.modeling_utils import PreTrainedModel
from transformers.utils import logging as hf_logging

GENUINE_TIE_WEIGHTS = PreTrainedModel.__dict__["tie_weights"]  # the class's own, read before any load


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers without its log lines and bars; and, whatever happens inside, its weight tying as it was. A load
    that fails inside from_pretrained (a damaged file, a refused weight) can leave transformers' no_tie_weights()
    patch on PreTrainedModel until the garbage collector finishes its context: every tied model loaded meanwhile
    then lacked its head ("lacks lm_head.weight"), in a later load of the same process."""
    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    PreTrainedModel.tie_weights = GENUINE_TIE_WEIGHTS  # an earlier failed load may have left it patched
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        PreTrainedModel.tie_weights = GENUINE_TIE_WEIGHTS
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


BNB_CAST = "MatMul8bitLt: inputs will be cast"


def _not_a_cast_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(BNB_CAST)


def quiet_bitsandbytes_casts() -> None:
    """Drop bitsandbytes' 8-bit warning that activations other than float16 are cast: it comes on every layer
    of every forward, and the cast is the configured dtype's (see devices.quantization_config). Idempotent."""
    log = logging.getLogger("bitsandbytes.autograd._functions")
    if _not_a_cast_warning not in log.filters:
        log.addFilter(_not_a_cast_warning)


RENAMED_CACHE = r"`past_key_values` is deprecated"


def quiet_renamed_cache_argument() -> None:
    """Drop transformers' FutureWarning that forward's past_key_values is now called cache (5.24 and later): a
    model on transformers' forward warns mid-chat on stderr, and the old name is the one every 5.x release takes
    (speculative/model_io.py passes it). Idempotent."""

    warnings.filterwarnings("ignore", message=RENAMED_CACHE, category=FutureWarning)
