"""A GGUF's Q4_K layers built from the file at every start, so the stored weights need not hold a second copy.

Q4_K blocks run on the w4a8 kernel as stored (gguf/blocks.py); their tiles are a byte shuffle of the file's bytes,
which the compiled module does at the speed of reading them (kernels/q4/file_tiles.cpp). So where a user's GGUF
stays on disk, the stored weights keep, for each such layer, only a marker naming the file's tensor (MARKER), and a
start tiles that tensor straight into its place among the stored tiles (tile_arena.py). A layer becomes a marker
only where the file's tiles, built so, are bit for bit those the first start made (as_stored_layers): one whose
rows transformers reorders (Llama's q and k), or of any other type, keeps its tiles in the stored weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from gguf import GGMLQuantizationType

from specchat.kernels.build import q4_kernel
from specchat.loading.gguf.blocks import Q4_K_BYTES, module_name
from specchat.loading.gguf.header import read_tensors
from specchat.quant.q4_levels import GROUP
from specchat.quant.q4_tiles import TILE_ROWS, Q4Tiles

MARKER = "from_file"  # "<layer>.from_file": a 0-dim int64, the GGML type of the file's tensor the layer is tiled from
Q4_K_INPUTS = 256  # inputs a Q4_K block
Q4_K_TYPE = int(GGMLQuantizationType.Q4_K)  # what a marker holds


class FileChanged(ValueError):
    """The GGUF no longer holds the Q4_K tensor a marker names (the stored weights are then rebuilt)."""


def tile_shapes(rows: int, inputs: int) -> dict[str, tuple[torch.dtype, list[int]]]:
    """The fields of a Q4_K layer's tiles (rows × inputs weights), whole (dmin not left out): name → (dtype, shape)."""
    tiles, groups, blocks = -(-rows // TILE_ROWS), inputs // GROUP, inputs // Q4_K_INPUTS
    return {
        "qs": (torch.uint8, [tiles, groups, 16 * TILE_ROWS]),
        "sc": (torch.uint8, [tiles, groups, TILE_ROWS]),
        "m": (torch.uint8, [tiles, groups // 2, 2 * TILE_ROWS]),
        "d": (torch.float16, [tiles, blocks, TILE_ROWS]),
        "dmin": (torch.float16, [tiles, blocks, TILE_ROWS]),
    }


def tile_q4_k(raw: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> Q4Tiles:
    """The tiles of Q4_K blocks, uint8 [rows, blocks·144], written into `into` (placed tensors of tile_shapes) or
    fresh ones: Q4Tiles.from_block(decode_q4_k(raw)) bit for bit."""
    rows, inputs = raw.shape[0], raw.shape[1] // Q4_K_BYTES * Q4_K_INPUTS
    fields = into or {
        name: torch.empty(shape, dtype=dtype) for name, (dtype, shape) in tile_shapes(rows, inputs).items()
    }
    q4_kernel().tile_q4_k(raw.contiguous(), *(fields[name] for name in ("qs", "sc", "m", "d", "dmin")))
    return Q4Tiles(*(fields[name] for name in ("qs", "sc", "m", "d", "dmin")), outs=rows).compact()


def q4_k_tensors(gguf: Path) -> dict[str, object]:
    """The file's Q4_K weights by the module transformers names (gguf/blocks.py's module_name): header entries."""
    return {
        module_name(tensor.name): tensor
        for tensor in read_tensors(gguf)[1]
        if module_name(tensor.name) and tensor.tensor_type == GGMLQuantizationType.Q4_K
    }


def raw_blocks(tensor) -> torch.Tensor:
    """A header entry's stored bytes, uint8 [rows, bytes a row], read from the file."""
    return torch.from_numpy(tensor.data.reshape(tensor.rows, tensor.row_bytes))


def as_stored_layers(gguf: Path, blocks: dict[str, Q4Tiles]) -> set[str]:
    """The layers whose tiles the file's Q4_K tensor gives bit for bit: those a start may tile from the file."""
    same = set()
    for name, tensor in q4_k_tensors(gguf).items():
        tiles = blocks.get(name)
        if tiles is not None and _equal(tile_q4_k(raw_blocks(tensor)), tiles):
            same.add(name)
    return same


def _equal(a: Q4Tiles, b: Q4Tiles) -> bool:
    return a.outs == b.outs and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors())
    )


def tiles_from_file(gguf: Path, rows_of: dict[str, tuple[int, int]], placed: dict[str, torch.Tensor]) -> dict:
    """{layer: its tiles} for the marked layers (layer → (rows, inputs) the model gives it), each tiled from the
    file into its placed fields ("<layer>.<field>" in `placed`, else fresh memory). FileChanged where the file's
    tensor is missing, not Q4_K, or not of the layer's shape."""
    found = q4_k_tensors(gguf)
    tiles = {}
    for layer, (rows, inputs) in rows_of.items():
        tensor = found.get(layer)
        if tensor is None or (tensor.rows, tensor.row_bytes) != (rows, inputs // Q4_K_INPUTS * Q4_K_BYTES):
            raise FileChanged(f"{gguf.name} no longer holds the Q4_K blocks of {layer} its stored weights name")
        fields = {name: placed[f"{layer}.{name}"] for name in tile_shapes(rows, inputs) if f"{layer}.{name}" in placed}
        tiles[layer] = tile_q4_k(raw_blocks(tensor), fields if len(fields) == 5 else None)
    return tiles


class MarkedPlacement:
    """The placement (tile_arena.placer's `place`) of stored weights whose marked layers are tiled from the GGUF:
    their fields are placed among the stored tiles too, so a group's fused tiles stay views of one region.
    shapes: layer → (rows, inputs), from the model."""

    def __init__(self, place, shapes: dict[str, tuple[int, int]]):
        self.place, self.shapes = place, shapes
        self.placed: dict[str, torch.Tensor] = {}

    def __call__(self, entries: dict) -> dict[str, torch.Tensor]:
        marked = [name.removesuffix(f".{MARKER}") for name in entries if name.endswith(f".{MARKER}")]
        extra = {
            f"{layer}.{field}": entry
            for layer in marked
            if layer in self.shapes
            for field, entry in tile_shapes(*self.shapes[layer]).items()
        }
        where = self.place({**entries, **extra})
        self.placed = {name: tensor for name, tensor in where.items() if name in extra}
        return {name: tensor for name, tensor in where.items() if name not in extra}

    def tiles(self, gguf: Path, marked: set[str]) -> dict[str, Q4Tiles]:
        """The marked layers' tiles, from the file into their places (tiles_from_file)."""
        unknown = sorted(marked - set(self.shapes))
        if unknown:
            raise FileChanged(f"its marker names {unknown[0]}, which is no layer of this model")
        return tiles_from_file(gguf, {layer: self.shapes[layer] for layer in marked}, self.placed)
