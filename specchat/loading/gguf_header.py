"""A GGUF file's tensor table, read in a tenth of a second.

gguf-py's GGUFReader parses every metadata value through numpy memmap slices: 15 s for the bundled drafter,
most of it its 151,936-token vocabulary. specchat needs only the architecture and where each tensor lies, so
it walks the header with struct and skips every other value (format: ggml's docs/gguf.md, versions 2 and 3).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# metadata value types of fixed width (u8 i8 u16 i16 u32 i32 f32 bool, u64 i64 f64); 8 is a string, 9 an array
WIDTHS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file, its parts named as gguf-py's ReaderTensor names them."""
    name: str
    shape: tuple[int, ...]  # ggml order: the fastest-moving dimension (a row's width) first
    tensor_type: object     # gguf.GGMLQuantizationType
    path: Path
    start: int              # byte offset in the file
    rows: int
    row_bytes: int

    @property
    def data(self) -> np.ndarray:
        """The stored values or blocks ([rows, bytes a row]), read from the file now: read, not mapped, so the
        pages are the system's page cache and not this process's resident set."""
        data = np.fromfile(self.path, dtype=np.uint8, count=self.rows * self.row_bytes, offset=self.start)
        return _shaped(data, self.tensor_type, self.shape, self.rows)


def read_tensors(path: Path) -> tuple[dict, list[TensorEntry]]:
    """({"general.architecture": ..., "general.alignment": ...}, the tensors in file order)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    blob = np.memmap(path, mode="r").view(np.ndarray)
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    version, tensor_count, value_count = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
    facts, pos = _read_values(blob, value_count, 24)
    table, pos = _read_table(blob, tensor_count, pos)
    alignment = int(facts.get("general.alignment", 32))
    start = (pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, dims, kind, offset in table:
        kind = GGMLQuantizationType(kind)
        block, size = GGML_QUANT_SIZES[kind]
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        tensors.append(TensorEntry(name, dims, kind, Path(path), start + offset, rows, dims[0] // block * size))
    return facts, tensors


def _shaped(data: np.ndarray, kind, dims: tuple[int, ...], rows: int) -> np.ndarray:
    """Float tensors as their values in numpy order (as gguf-py gives them), blocks as [rows, bytes a row]."""
    from gguf import GGMLQuantizationType
    floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    if kind in floats:
        return data.view(floats[kind]).reshape(tuple(reversed(dims)))
    return data.reshape(rows, -1)


def _read_values(blob: np.ndarray, count: int, pos: int) -> tuple[dict, int]:
    """The general.* facts (strings, and numbers as their unsigned bits: general.alignment is the one read)."""
    facts = {}
    for _ in range(count):
        key, pos = _string(blob, pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        value, pos = _value(blob, kind, pos + 4)
        if key.startswith("general."):
            facts[key] = value
    return facts, pos


def _value(blob: np.ndarray, kind: int, pos: int):
    """(the value, or None for an array, which is skipped; the position after it)."""
    if kind == STRING:
        return _string(blob, pos)
    if kind == ARRAY:
        item, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if item in WIDTHS:
            return None, pos + WIDTHS[item] * count
        for _ in range(count):
            _, pos = _value(blob, item, pos)
        return None, pos
    value = struct.unpack_from({1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[WIDTHS[kind]], blob, pos)[0]  # the bits, unsigned
    return value, pos + WIDTHS[kind]


def _string(blob: np.ndarray, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    return bytes(blob[pos:pos + length]).decode("utf-8", errors="replace"), pos + length


def _read_table(blob: np.ndarray, count: int, pos: int) -> tuple[list, int]:
    table = []
    for _ in range(count):
        name, pos = _string(blob, pos)
        (dims_count,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{dims_count}Q", blob, pos + 4)
        pos += 4 + 8 * dims_count
        kind, offset = struct.unpack_from("<IQ", blob, pos)
        table.append((name, tuple(int(d) for d in dims), kind, offset))
        pos += 12
    return table, pos
