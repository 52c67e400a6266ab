"""The committed sequence and the target's KV cache over it: a new prompt adopted with the cached common prefix
kept, read in chunks with progress, and each step's tokens appended with both models' caches cropped back.

After every step the target's KV cache covers ids[:len(ids)-1] (the newest token is fed next step), and so does the
drafter's, except after a step whose drafts were all accepted, when it lags one more token and catches up on its
next forward.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import torch

from specchat.config import Mode
from specchat.speculative import model_io
from specchat.speculative.drafters.base import Drafter, TargetRows
from specchat.speculative.drafters.lookup import common_prefix_len
from specchat.speculative.events import PrefillProgress
from specchat.speculative.model_io import Model


class Conversation:
    def __init__(self, target: Model) -> None:
        self.target = target
        self.kv = model_io.new_kv_cache(target)
        self.ids: list[int] = []

    @property
    def target_seen(self) -> int:
        return model_io.kv_length(self.kv)

    def reset(self) -> None:
        """Forget every committed and cached token."""
        self.kv = model_io.new_kv_cache(self.target)
        self.ids = []

    def adopt(self, prompt_ids: list[int], drafter: Drafter | None) -> None:
        """Make `prompt_ids` the committed sequence, keeping cached KV for the common prefix (the drafter keeps
        what agrees with what it last observed)."""
        keep = min(common_prefix_len(self.ids, prompt_ids), len(prompt_ids) - 1)
        model_io.crop_to(self.kv, min(self.target_seen, keep))
        if drafter:
            drafter.observe(prompt_ids)
        self.ids = list(prompt_ids)

    def read_prompt(self, mode: Mode, drafter: Drafter | None, cancel: threading.Event) -> Iterator[PrefillProgress]:
        """Read a new prompt (all but its newest token, which the first step feeds) into the caches of the models
        the mode uses, model_io.PREFILL_CHUNK tokens at a time, with progress after each chunk. Cancelling stops
        between chunks: the caches then hold a prefix of the prompt, which the next reply reuses or crops."""
        end, start = len(self.ids) - 1, self.prompt_read(mode, drafter)
        began, chunk = time.perf_counter(), model_io.PREFILL_CHUNK
        for upto in [*range(start + chunk, end, chunk), end] if end > start else []:
            if cancel.is_set():
                break
            rows = None
            if mode != Mode.DRAFTER:
                model_io.forward(self.target, self.kv, self.ids[self.target_seen : upto], keep=1)
                rows = self._rows(upto - 1)
            if drafter and mode != Mode.TARGET:
                drafter.observe(self.ids, read=upto, target=rows)
            yield PrefillProgress(upto - start, end - start, time.perf_counter() - began)

    def prompt_read(self, mode: Mode, drafter: Drafter | None) -> int:
        """Tokens in the cache of the model that leads the mode (the drafter's in drafter mode)."""
        if mode == Mode.DRAFTER:
            return drafter.observe(self.ids) if drafter is not None else 0
        return self.target_seen

    def append(self, tokens: list[int], drafter: Drafter | None, fed_rows: torch.Tensor | None = None) -> None:
        """Commit `tokens`; crop the target's KV cache to all but the newest token; the drafter rolls back too, and
        is handed the target's hidden states of the step's forward (`fed_rows`, a row a token fed from the pending
        one on) at the committed positions."""
        start = len(self.ids) - 1
        self.ids.extend(tokens)
        model_io.crop_to(self.kv, min(self.target_seen, len(self.ids) - 1))
        if drafter:
            rows = TargetRows(start, fed_rows[: len(tokens)]) if fed_rows is not None else None
            drafter.observe(self.ids, target=rows)

    def _rows(self, position: int) -> TargetRows | None:
        """The target's hidden state at `position`, from its last forward (which kept that row alone)."""
        hidden = model_io.features(self.kv)
        return TargetRows(position, hidden[-1:]) if hidden is not None else None
