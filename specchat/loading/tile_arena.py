"""Stored w4a8 tiles read straight into their place: one region (in 2 MB pages where the system offers them,
loading/huge_pages.py), where the tiles of layers that read one input (q/k/v, gate/up) lie side by side, field by
field, so that the fused tiles of their group (Q4Group) are views of the region rather than a copy, and nothing is
moved into 2 MB pages afterwards. A warm start of a 7B-shape Q4_0 file (Zen 5): the fusing's copies (1.9 s) and
the move into 2 MB pages (3.4 s) gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from specchat.loading.huge_pages import ALIGN, huge_page_region

FIELDS = ("qs", "sc", "m", "d", "dmin")  # a Q4Tiles' tensors, as the stored weights name them: "<layer>.<field>"
Entries = dict[str, tuple[torch.dtype, list[int]]]  # a file's tensors: name → (dtype, shape)
Placer = Callable[[Entries], dict[str, torch.Tensor]]


def placer(groups: list[list[str]]) -> Placer:
    """The placement of a stored weights file's tiles: for each group of layers (shared_input_groups), each field
    of its members side by side where they are alike (one dtype, one shape but the first dimension); every other
    tile on its own. Tensors that are not a tile's field are left out (read into fresh memory)."""

    def place(entries: Entries) -> dict[str, torch.Tensor]:
        runs = side_by_side_runs(entries, groups)
        offsets, total = _offsets(runs, entries)
        region = huge_page_region(total, touched=True)
        if region is None:
            region = torch.empty(total, dtype=torch.uint8)
        return {name: _carve(region, offsets[name], *entries[name]) for run in runs for name in run}

    return place


def side_by_side_runs(entries: Entries, groups: list[list[str]]) -> list[list[str]]:
    """Runs of tile tensors to lie side by side, in order: each group's alike fields, then every other tile alone."""
    runs: list[list[str]] = []
    for members in groups:
        for field in FIELDS:
            names = [f"{member}.{field}" for member in members]
            if all(name in entries for name in names) and len({_kind(entries[name]) for name in names}) == 1:
                runs.append(names)
    placed = {name for run in runs for name in run}
    runs += [[name] for name in entries if name not in placed and name.rpartition(".")[2] in FIELDS]
    return runs


def _kind(entry: tuple[torch.dtype, list[int]]) -> tuple:
    dtype, shape = entry
    return dtype, tuple(shape[1:]) if shape else None


def _offsets(runs: list[list[str]], entries: Entries) -> tuple[dict[str, int], int]:
    """Each tensor's first byte: a run's tensors one after another with no gap, each run ALIGN-aligned."""
    offsets, total = {}, 0
    for run in runs:
        total = -(-total // ALIGN) * ALIGN
        for name in run:
            offsets[name] = total
            total += _nbytes(*entries[name])
    return offsets, total


def _nbytes(dtype: torch.dtype, shape: list[int]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _carve(region: torch.Tensor, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    return region[offset : offset + _nbytes(dtype, shape)].view(dtype).view(shape)
