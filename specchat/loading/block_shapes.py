"""What a stored block must look like to replace a layer: each field's dtype and shape, from the layer's
output rows and input width. stored_weights.py checks every block it reads against the model's layers
before it hands them over: the kernels index with these shapes, so a damaged or hostile file whose hash
record matches would otherwise reach C++ as reads and writes out of bounds, not as an error."""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.int8_weights import Int8Block
from specchat.quant.q4_block import block_width
from specchat.quant.q4_levels import GROUP, PAIR
from specchat.quant.q4_tiles import TILE_ROWS, Q4Tiles

ROW_BYTES = (16, 24, 32)  # bytes a tile's 32-group takes per row: 4-, 6- or 8-bit levels (Q4Tiles.bits)


def expected_fields(kind: type, outs: int, width: int) -> dict:
    """{field: allowed (dtype, shape) pairs}, and for a whole-number field {field: value}."""
    if kind is Int8Block:
        return {
            "weight": [(torch.int8, (outs, width))],
            "scale": [(torch.float32, (outs,))],
            "row_sums": [(torch.float32, (outs,))],
        }
    if kind is Q4Tiles:
        tiles, groups, blocks = -(-outs // TILE_ROWS), width // GROUP, width // block_width(width)
        per_block = [(torch.float16, (tiles, blocks, TILE_ROWS)), (torch.float16, (tiles, groups, TILE_ROWS))]
        halves = (torch.int8, (tiles, groups, 2 * TILE_ROWS))  # a signed scale and offset per 16 inputs (Q6_K's)
        return {
            "qs": [(torch.uint8, (tiles, groups, TILE_ROWS * size)) for size in ROW_BYTES]
            + [(torch.int8, (tiles, groups, TILE_ROWS * ROW_BYTES[0]))],  # 4-bit table indices (IQ4's)
            "sc": [(torch.uint8, (tiles, groups, TILE_ROWS)), halves, (torch.uint8, (tiles, groups, 0))],  # 0: all 1
            "m": [(torch.uint8, (tiles, width // PAIR, 2 * TILE_ROWS)), halves],
            "d": per_block,
            "dmin": per_block + [(torch.float16, (tiles, count, 0)) for count in (blocks, groups)],  # 0: d's
            "outs": outs,
        }
    raise TypeError(f"no shapes known for {kind.__name__}")


def block_problem(block, linear: nn.Linear) -> str:
    """'' when `block` (an Int8Block or Q4Tiles) fits `linear`, else the first field that does not."""
    for field, wanted in expected_fields(type(block), linear.out_features, linear.in_features).items():
        value = getattr(block, field)
        if isinstance(wanted, int):
            if value != wanted:
                return f"{field} is {value}, not {wanted}"
            continue
        if not isinstance(value, torch.Tensor) or (value.dtype, tuple(value.shape)) not in wanted:
            found = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
            return f"{field} is {found}, not {wanted[0][0]} {list(wanted[0][1])}"
    if isinstance(block, Q4Tiles):
        return _tiles_problem(block)
    return ""


def _tiles_problem(tiles: Q4Tiles) -> str:
    """What the fields' shapes alone do not tell: their agreement with each other."""
    if tiles.sc.dtype != tiles.m.dtype:
        return f"sc is {tiles.sc.dtype} and m {tiles.m.dtype}: both a group's (uint8) or both a half's (int8)"
    if tiles.sc.shape[2] == 0 and tiles.d.shape[1] != tiles.sc.shape[1]:
        return "sc is left out (every scale 1), which only blocks of one 32-group may do"
    if tiles.dmin.shape[2] == 0 and tiles.dmin.shape[1] != tiles.d.shape[1]:
        return f"dmin is left out (d's), yet d is {list(tiles.d.shape)} and dmin {list(tiles.dmin.shape)}"
    return ""
