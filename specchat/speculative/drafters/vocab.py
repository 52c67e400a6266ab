"""A cheaper drafter output head: score only the ids the drafter is likely to need.

The drafter's head over a 152k vocabulary is about a third of a 0.5B drafter's time on a CPU.
DraftVocab scores every id below `limit`, plus every id already seen in the conversation (names from
the prompt, code fences) and the stop ids. The verifier checks drafts against the q the drafter
really sampled from (zero outside this set), so the output stays exactly the target's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

# An output head: nn.Linear, or a quantized layer with out_features and a `rows` method (Int8Linear, W8A8Linear).
# Any: torch types a module's attributes as Tensor | Module, so what each kind offers is read by duck typing.
Head = Any


class DraftVocab:
    def __init__(self, head: Head, limit: int, always_ids: Iterable[int] = ()) -> None:
        self.head = head
        self.limit = limit
        self.head_size = head_width(head)  # ids at or past it (a padded target vocabulary's) are never scored
        self._low = head_rows(head, slice(0, limit))
        self._always = sorted({int(i) for i in always_ids if limit <= i < self.head_size})
        self._extra: list[int] = list(self._always)
        self._extra_index = torch.tensor(self._extra, dtype=torch.long)
        self._placed: torch.Tensor | None = None  # _extra_index on the device that last asked for it
        self._high: nn.Module | None = None  # the head's rows for the extra ids, rebuilt when the set grows
        self._scanned = 0  # how much of the id list has been looked at

    @property
    def width(self) -> int:
        return self.limit + len(self._extra)

    def update(self, ids: list[int]) -> None:
        """Add ids at or above the limit seen since the last call (the set only grows)."""
        if len(ids) < self._scanned:
            self._scanned = 0  # a different, shorter conversation: look at all of it
        fresh = {i for i in ids[self._scanned :] if self.limit <= i < self.head_size} - set(self._extra)
        self._scanned = len(ids)
        if fresh:
            self._extra = sorted(set(self._extra) | fresh)
            self._extra_index = torch.tensor(self._extra, dtype=torch.long)
            self._high, self._placed = None, None

    def keep_first(self, length: int) -> None:
        """The conversation may differ after its first `length` ids (a new system prompt, dropped
        turns): forget the ids seen after them, so the drafter proposes what a fresh one would."""
        if length >= self._scanned:
            return
        self._extra, self._scanned, self._high, self._placed = list(self._always), 0, None, None
        self._extra_index = torch.tensor(self._extra, dtype=torch.long)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, width]: ids below the limit first, then the extra ids in order."""
        low: torch.Tensor = self._low(hidden)
        if not self._extra:
            return low
        if self._high is None:
            self._high = head_rows(self.head, self._index_on(hidden.device))
        return torch.cat([low, self._high(hidden)], dim=-1)

    @property
    def layers(self) -> list[torch.nn.Module]:
        """The head rows built so far: ids below the limit, and the extra ids once scored."""
        return [self._low] + ([self._high] if self._high is not None else [])

    def _index_on(self, device: torch.device) -> torch.Tensor:
        """The extra ids on `device`, copied there once (not once per drafted token)."""
        if self._placed is None or self._placed.device != device:
            self._placed = self._extra_index.to(device)
        return self._placed

    def to_ids(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions in [0, width) -> vocabulary ids."""
        if not self._extra:
            return positions
        extra = self._index_on(positions.device)
        return torch.where(positions < self.limit, positions, extra[(positions - self.limit).clamp(min=0)])

    def full_width(self, q: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[k, width] probabilities -> [k, vocab_size], zero for ids the drafter never proposes."""
        full = torch.zeros(q.shape[0], vocab_size, dtype=q.dtype, device=q.device)
        full[:, : self.limit] = q[:, : self.limit]
        if self._extra:
            full[:, self._index_on(q.device)] = q[:, self.limit :]
        return full


class RowsOfLinear(nn.Module):
    """Some output rows of an nn.Linear (a view of its weights, no copy when `index` is a slice)."""

    def __init__(self, linear: nn.Linear, index: torch.Tensor | slice):
        super().__init__()
        self.weight = linear.weight[index]
        self.bias = None if linear.bias is None else linear.bias[index]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight, self.bias)


def head_width(head: Head) -> int:
    """How many ids an output head scores (nn.Linear or a quantized layer)."""
    width: int = getattr(head, "out_features", None) or head.weight.shape[0]
    return width


def head_rows(head: Head, index: torch.Tensor | slice) -> nn.Module:
    """A layer computing only the output rows `index` of an output head (nn.Linear, or a
    quantized layer with a `rows` method: Int8Linear, W8A8Linear)."""
    if hasattr(head, "rows"):
        rows: nn.Module = head.rows(index)
        return rows
    return RowsOfLinear(head, index)
