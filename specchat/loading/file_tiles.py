"""A GGUF's layers built from the file at every start, so the stored weights need not hold a second copy of them.

Layers of the types in BLOCK_BYTES (Q4_K and Q6_K: all of a Q4_K_M file's; Q5_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1,
IQ4_NL, Q8_0) run on the w4a8 kernel as stored (gguf/blocks.py), and their tiles are a shuffle of the file's bits,
which the compiled module does at about the speed of reading them (kernels/q4/file_tiles.cpp). So where a user's GGUF stays on disk, the stored
weights keep, for each such layer, only a marker naming the type of the file's tensor ("<layer>.from_file_Q4_K"),
and a start tiles that tensor straight into its place among the stored tiles (tile_arena.py). A model read a tensor
at a time (its weights never loaded) has its layers marked where the mode runs the type as stored, the shape fits and
every scale is finite (tileable_layers): the first start does not decode them the slow way first, since the tiles are
that decoding's bit for bit (tests/loading/test_file_tiles.py); it writes the markers and reads back as a later start
does. A model whose weights were loaded has a layer marked only where the file's tiles are bit for bit those it made
(as_stored_layers). A layer requantized, or of any other type, keeps its tiles in the stored weights. Where transformers reorders a tensor's rows (Llama's q and k), the marker holds the
order (int64 [rows]: the stored row each of the layer's rows is), and the file's rows are tiled in that order.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from gguf import GGMLQuantizationType

from specchat.kernels.build import q4_kernel
from specchat.loading.gguf.blocks import (
    GROUP_BLOCK_BYTES,
    IQ4_XS_BYTES,
    Q4_K_BYTES,
    Q5_K_BYTES,
    Q6_K_BYTES,
    as_stored,
    module_name,
)
from specchat.loading.gguf.header import read_tensors
from specchat.loading.gguf.tensors import GGUFTensors, streamable
from specchat.quant.q4_block import QUANTIZE_ROWS
from specchat.quant.q4_levels import GROUP
from specchat.quant.q4_tiles import TILE_ROWS, Q4Tiles
from specchat.quant.w4a8 import fitting_linears

MARKER = "from_file_"  # "<layer>.from_file_<type>": int64, the GGML type (0-dim), or the row order (rows)
GROUP_KINDS = {
    "Q4_0": 0,
    "Q4_1": 1,
    "IQ4_NL": 2,
    "Q8_0": 3,
    "Q5_0": 4,
    "Q5_1": 5,
}  # the one-group types tiled from the file: the kernel's codes
BLOCK_BYTES = {"Q4_K": Q4_K_BYTES, "Q5_K": Q5_K_BYTES, "Q6_K": Q6_K_BYTES, "IQ4_XS": IQ4_XS_BYTES, "IQ4_NL": 18} | {
    kind: GROUP_BLOCK_BYTES[kind] for kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
}  # the types tiled from the file, and their blocks' bytes


class FileChanged(ValueError):
    """The GGUF no longer holds the blocks a marker names (the stored weights are then rebuilt)."""


FIELDS = ("qs", "sc", "m", "d", "dmin")


def block_inputs(kind: str) -> int:
    """Inputs a block of `kind` covers: 32 for the one-group types, 256 for the K types."""
    return GROUP if kind in GROUP_KINDS else 256


def tile_shapes(kind: str, rows: int, inputs: int) -> dict[str, tuple[torch.dtype, list[int]]]:
    """The fields of a layer's tiles (rows × inputs weights) of a type in BLOCK_BYTES: name → (dtype, shape). The K
    types' whole (dmin not left out; Q6_K and IQ4_XS with a scale a 16: halves); the one-group types' without their
    scales (every one 1) and, but Q4_1's and Q5_1's, without dmin (it is d), as Q4Tiles.compact leaves them out. Levels
    take 16 bytes a group's tile row (4 bits), 24 (6 bits: Q5_*, Q6_K) or 32 (Q8_0); IQ4's table indices are int8."""
    tiles, groups, blocks = -(-rows // TILE_ROWS), inputs // GROUP, inputs // block_inputs(kind)
    width = (32 if kind == "Q8_0" else 24 if kind.startswith(("Q5", "Q6")) else 16) * TILE_ROWS
    qs = (torch.int8 if kind.startswith("IQ4") else torch.uint8, [tiles, groups, width])
    if kind in GROUP_KINDS:
        return {
            "qs": qs,
            "sc": (torch.uint8, [tiles, groups, 0]),
            "m": (torch.uint8, [tiles, groups // 2, 2 * TILE_ROWS]),
            "d": (torch.float16, [tiles, groups, TILE_ROWS]),
            "dmin": (torch.float16, [tiles, groups, TILE_ROWS if kind in ("Q4_1", "Q5_1") else 0]),
        }
    if kind in ("Q6_K", "IQ4_XS"):
        sc = m = (torch.int8, [tiles, groups, 2 * TILE_ROWS])
    else:
        sc, m = (torch.uint8, [tiles, groups, TILE_ROWS]), (torch.uint8, [tiles, groups // 2, 2 * TILE_ROWS])
    half = (torch.float16, [tiles, blocks, TILE_ROWS])
    return {"qs": qs, "sc": sc, "m": m, "d": half, "dmin": half}


def tile_blocks(kind: str, raw: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> Q4Tiles:
    """The tiles of blocks of a type in BLOCK_BYTES, uint8 [rows, blocks·bytes], written into `into` (placed tensors
    of tile_shapes) or fresh ones: Q4Tiles.from_block of gguf/blocks.py's decoding of them, bit for bit."""
    rows, inputs = raw.shape[0], raw.shape[1] // BLOCK_BYTES[kind] * block_inputs(kind)
    shapes = tile_shapes(kind, rows, inputs)
    fields = into or {name: torch.empty(shape, dtype=dtype) for name, (dtype, shape) in shapes.items()}
    kernel, raw = q4_kernel(), raw.contiguous()
    if kind in GROUP_KINDS:
        kernel.tile_group_blocks(raw, GROUP_KINDS[kind], fields["qs"], fields["m"], fields["d"], fields["dmin"])
    elif kind == "Q6_K":
        kernel.tile_q6_k(raw, *(fields[name] for name in FIELDS))
    elif kind == "IQ4_XS":
        kernel.tile_iq4_xs(raw, *(fields[name] for name in FIELDS))
    else:
        kernel.tile_q4_k(raw, kind == "Q5_K", *(fields[name] for name in FIELDS))
    return Q4Tiles(*(fields[name] for name in FIELDS), outs=rows).compact()


def file_tensors(gguf: Path) -> dict[str, object]:
    """The file's weights of the types in BLOCK_BYTES by the module transformers names (gguf/blocks.py's
    module_name): header entries."""
    return {
        module_name(tensor.name): tensor
        for tensor in read_tensors(gguf)[1]
        if module_name(tensor.name) and tensor.tensor_type.name in BLOCK_BYTES
    }


def marker(kind: str) -> str:
    return f"{MARKER}{kind}"


def marker_value(kind: str, order: torch.Tensor | None = None) -> torch.Tensor:
    """What a marker holds: the row order where there is one, else the GGML type."""
    return order if order is not None else torch.tensor(int(GGMLQuantizationType[kind]))


def marked_layers(names) -> dict[str, str]:
    """{layer: type} of the marker names among `names` ("<layer>.from_file_<type>")."""
    found = {}
    for name in names:
        layer, _, field = name.rpartition(".")
        if field.startswith(MARKER):
            found[layer] = field.removeprefix(MARKER)
    return found


def raw_blocks(tensor) -> torch.Tensor:
    """A header entry's stored bytes, uint8 [rows, bytes a row], mapped from the file (TensorEntry.mapped_blocks):
    the tiler reads the system's cached pages, with no copy into fresh memory (a 7B file's 4.4 GB)."""
    try:  # an OSError (EIO, EACCES) is the stored weights' reader's to say
        mapped = tensor.mapped_blocks()
    except ValueError:  # the file is shorter than its header says now
        raise FileChanged(f"{Path(tensor.path).name} no longer holds all of its tensor {tensor.name}") from None
    with warnings.catch_warnings():  # the tiler only reads it: torch's warning about a read-only array is moot
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(mapped)


def as_stored_layers(
    gguf: Path, blocks: dict[str, Q4Tiles], orders: dict[str, torch.Tensor]
) -> dict[str, tuple[str, torch.Tensor | None]]:
    """{layer: (type, row order or None)} of the layers whose tiles the file's tensor gives bit for bit (its rows in
    the order transformers puts them: `orders`, row_orders'): those a start may tile from the file."""
    same = {}
    for name, tensor in file_tensors(gguf).items():
        tiles, kind, order = blocks.get(name), tensor.tensor_type.name, orders.get(name)
        if tiles is not None and same_tiles(kind, in_order(raw_blocks(tensor), order), tiles):
            same[name] = (kind, order)
    return same


def tileable_layers(gguf: Path, model, finer_bits: int) -> dict[str, tuple[str, torch.Tensor | None]]:
    """{layer: (type, row order or None)} of the model's layers a start may tile from the file (a model read a tensor
    at a time: gguf/tensors.py's streamable, its weights on the meta device): a tensor of a type in BLOCK_BYTES that
    the mode runs as stored (gguf/blocks.py's as_stored: w4a8-fast requantizes the finer ones), of the layer's shape,
    its rows as transformers puts them (reordered at most), and every scale of its tiles finite (else its stored block
    is read as before: a scale past float16's range is requantized, a NaN refused). What the first start's reference
    decoding gives such a layer is its tiles bit for bit (tests/loading/test_file_tiles.py), so it is not made."""
    if not streamable(gguf):
        return {}
    tensors, linears = GGUFTensors(gguf, model), fitting_linears(model)
    found = {}
    for layer, tensor in file_tensors(gguf).items():
        kind, linear, weight = tensor.tensor_type.name, linears.get(layer), f"{layer}.weight"
        if linear is None or weight not in tensors or not as_stored(kind, finer_bits):
            continue
        wanted = (linear.out_features, linear.in_features // block_inputs(kind) * BLOCK_BYTES[kind])
        if linear.in_features % block_inputs(kind) or (tensor.rows, tensor.row_bytes) != wanted:
            continue
        try:
            order = tensors.row_order(weight)
        except ValueError:  # transformers does more than reorder its rows
            continue
        if finite_tiles(kind, in_order(raw_blocks(tensor), order)):
            found[layer] = (kind, order)
    return found


def layer_tiles(gguf: Path, layers: dict[str, tuple[str, torch.Tensor | None]]) -> dict[str, Q4Tiles]:
    """{layer: its tiles, made from the file's blocks} for layers of tileable_layers' ({layer: (type, row order)})."""
    found = file_tensors(gguf)
    return {
        layer: tile_blocks(kind, in_order(raw_blocks(found[layer]), order)) for layer, (kind, order) in layers.items()
    }


def finite_tiles(kind: str, raw: torch.Tensor) -> bool:
    """Whether every scale of the tiles of these blocks is finite, tiled QUANTIZE_ROWS rows at a time."""
    for start in range(0, raw.shape[0], QUANTIZE_ROWS):
        tiles = tile_blocks(kind, raw[start : start + QUANTIZE_ROWS])
        if not all(bool(torch.isfinite(scales).all()) for scales in (tiles.d, tiles.full_dmin)):
            return False
    return True


def row_orders(gguf: Path, model) -> dict[str, torch.Tensor]:
    """{layer: the stored row each of its rows is} for the file's tensors whose rows transformers reorders (Llama's q
    and k), where its processor does nothing else (gguf/tensors.py); none for a file it does more to. `model`: as
    loaded, before its layers are quantized (their weights' names are how the file's tensors are found)."""
    if not streamable(gguf):
        return {}
    tensors = GGUFTensors(gguf, model)
    orders = {}
    for layer in file_tensors(gguf):
        weight = f"{layer}.weight"
        if weight in tensors and not tensors.unchanged(weight):
            try:
                order = tensors.row_order(weight)
            except ValueError:  # more than reordered: its tiles are compared as they are, and differ
                continue
            if order is not None:
                orders[layer] = order
    return orders


def in_order(raw: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """The stored rows in the layer's order (a copy), or as they are."""
    return raw if order is None else raw[order]


def checked_order(order: torch.Tensor, rows: int, layer: str) -> torch.Tensor | None:
    """A marker's row order, checked to be a permutation of the layer's rows; None for a 0-dim marker (no order)."""
    if order.dim() == 0:
        return None
    ok = order.dim() == 1 and order.dtype == torch.int64 and len(order) == rows
    if not ok or not torch.equal(order.sort().values, torch.arange(rows)):
        raise FileChanged(f"its row order for {layer} is not one of the layer's {rows} rows each once")
    return order


def same_tiles(kind: str, raw: torch.Tensor, tiles: Q4Tiles) -> bool:
    """Whether tile_blocks(kind, raw) would be `tiles`, bit for bit, field for field (dmin left out alike), tiled
    QUANTIZE_ROWS rows at a time: a 151,936-row head is not held twice."""
    rows, inputs = raw.shape[0], raw.shape[1] // BLOCK_BYTES[kind] * block_inputs(kind)
    shapes = tile_shapes(kind, rows, inputs)
    wanted = dict(zip(FIELDS, tiles.tensors()))
    if tiles.outs != rows or any(
        (wanted[name].dtype, list(wanted[name].shape)) != shapes[name] for name in FIELDS if name != "dmin"
    ):
        return False
    min_left_out = wanted["dmin"].shape[2] == 0
    min_is_d = True
    for start in range(0, rows, QUANTIZE_ROWS):
        chunk = tile_blocks(kind, raw[start : start + QUANTIZE_ROWS])
        at = slice(start // TILE_ROWS, start // TILE_ROWS + chunk.qs.shape[0])
        if not all(torch.equal(got, wanted[name][at]) for name, got in zip(FIELDS[:4], chunk.tensors())):
            return False
        min_is_d = min_is_d and torch.equal(chunk.full_dmin, chunk.d)
        if not min_left_out and not torch.equal(chunk.full_dmin, wanted["dmin"][at]):
            return False
    return min_left_out == min_is_d  # the whole layer's dmin left out exactly where tile_blocks leaves it out


def tiles_from_file(
    gguf: Path,
    marked: dict[str, str],
    rows_of: dict[str, tuple[int, int]],
    placed: dict[str, torch.Tensor],
    values: dict[str, torch.Tensor],
) -> dict:
    """{layer: its tiles} for the marked layers ({layer: type}; layer → (rows, inputs) the model gives it; values:
    what each marker holds), each tiled from the file, its rows in the marker's order, into its placed fields
    ("<layer>.<field>" in `placed`, else fresh memory). FileChanged where the file's tensor is missing, of another
    type, or not of the layer's shape, or an order is not one."""
    found = file_tensors(gguf)
    tiles = {}
    for layer, kind in marked.items():
        (rows, inputs), tensor = rows_of[layer], found.get(layer)
        wanted = (kind, rows, inputs // block_inputs(kind) * BLOCK_BYTES[kind])
        if tensor is None or (tensor.tensor_type.name, tensor.rows, tensor.row_bytes) != wanted:
            raise FileChanged(f"{gguf.name} no longer holds the {kind} blocks of {layer} its stored weights name")
        order = checked_order(values[layer], rows, layer)
        fields = {name: placed[f"{layer}.{name}"] for name in FIELDS if f"{layer}.{name}" in placed}
        raw = in_order(raw_blocks(tensor), order)
        tiles[layer] = tile_blocks(kind, raw, fields if len(fields) == len(FIELDS) else None)
    return tiles


class MarkedPlacement:
    """The placement (tile_arena.placer's `place`) of stored weights whose marked layers are tiled from the GGUF:
    their fields are placed among the stored tiles too, so a group's fused tiles stay views of one region.
    shapes: layer → (rows, inputs), from the model."""

    def __init__(self, place, shapes: dict[str, tuple[int, int]]):
        self.place, self.shapes = place, shapes
        self.placed: dict[str, torch.Tensor] = {}

    def __call__(self, entries: dict) -> dict[str, torch.Tensor]:
        marked = marked_layers(entries)
        extra = {
            f"{layer}.{field}": entry
            for layer, kind in marked.items()
            if layer in self.shapes and kind in BLOCK_BYTES
            for field, entry in tile_shapes(kind, *self.shapes[layer]).items()
        }
        where = self.place({**entries, **extra})
        self.placed = {name: tensor for name, tensor in where.items() if name in extra}
        return {name: tensor for name, tensor in where.items() if name not in extra}

    def tiles(self, gguf: Path, marked: dict[str, str], values: dict[str, torch.Tensor]) -> dict[str, Q4Tiles]:
        """The marked layers' tiles ({layer: type}; values: what each marker holds), from the file into their places
        (tiles_from_file)."""
        unknown = sorted(layer for layer, kind in marked.items() if layer not in self.shapes or kind not in BLOCK_BYTES)
        if unknown:
            raise FileChanged(f"its marker names {unknown[0]}, which is no layer of this model tiled from a file")
        return tiles_from_file(gguf, marked, self.shapes, self.placed, values)
