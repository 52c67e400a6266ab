"""The stored weights' files: safetensors files written and read with plain file I/O.

Why not safetensors' own functions: they report an I/O failure as text (an unreadable file as a
FileNotFoundError without errno, a full disk as a SafetensorError), which cannot be told from damage; and
load_file maps the file, whose pages stay resident beside the copy a caller needs. Here an I/O failure is
an OSError with its errno, content that is not a well-formed file is DamagedFile, every offset and size is
checked against the file before anything is allocated (never more memory than the file holds), and each
tensor is read straight into fresh memory, which torch's allocator aligns to 64 bytes (the int8 kernel
crashes on weights that are not aligned). The files are ordinary safetensors files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import BinaryIO

import torch

from specchat.cache_folder import DamagedFile

DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_HEADER = 100 << 20  # bytes; safetensors' own limit
MAX_DIM = 1 << 40  # a dimension larger than this is damage, even of an empty tensor


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write `tensors` to `path` as a safetensors file (in name order) and fsync it."""
    names = sorted(tensors)
    header, offset = {}, 0
    for name in names:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned, as safetensors writes it
    with path.open("wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for name in names:
            out.write(_byte_view(tensors[name].detach().cpu().contiguous()))
        out.flush()
        os.fsync(out.fileno())


def read_tensors(path: Path, place=None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, in fresh memory, or where place({name: (dtype, shape)}) puts it (a dict
    of contiguous tensors of those dtypes and shapes: loading/tile_arena.py). OSError for I/O, DamagedFile for the
    content."""
    with path.open("rb") as src:
        size = os.fstat(src.fileno()).st_size
        length = int.from_bytes(_exactly(src, 8), "little")
        if length > min(MAX_HEADER, size - 8):
            raise DamagedFile(f"its header claims {length} bytes, more than the file holds")
        try:
            header = json.loads(_exactly(src, length))
        except (UnicodeDecodeError, ValueError) as err:
            raise DamagedFile(f"its header is not JSON ({err})") from None
        entries = _entries(header, size - 8 - length)
        placed = place({name: (dtype, shape) for name, (dtype, shape, _) in entries.items()}) if place else {}
        tensors = {}
        for name, (dtype, shape, begin) in sorted(entries.items(), key=lambda item: item[1][2]):  # in file order
            src.seek(8 + length + begin)
            tensors[name] = _read_into(src, placed[name] if name in placed else torch.empty(shape, dtype=dtype))
    return tensors


def _entries(header, data_bytes: int) -> dict[str, tuple[torch.dtype, list[int], int]]:
    """{name: (dtype, shape, first byte)} from a header, each checked to lie whole inside the data."""
    if not isinstance(header, dict):
        raise DamagedFile("its header is not a table of tensors")
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise DamagedFile(f"its entry for {name!r} is malformed") from None
        if not (
            isinstance(shape, list)
            and all(type(n) is int and 0 <= n <= MAX_DIM for n in shape)
            and type(begin) is int
            and type(end) is int
            and 0 <= begin <= end <= data_bytes
            and end - begin == math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        ):
            raise DamagedFile(f"its entry for {name!r} does not fit the file (shape {shape}, bytes {begin}..{end})")
        entries[name] = (dtype, shape, begin)
    return entries


def _exactly(src: BinaryIO, count: int) -> bytes:
    data = src.read(count)
    if len(data) != count:
        raise DamagedFile("it ends early")
    return data


def _read_into(src: BinaryIO, tensor: torch.Tensor) -> torch.Tensor:
    """Fill a fresh tensor from the file's next bytes."""
    view, done = memoryview(_byte_view(tensor)), 0
    while done < len(view):
        got = src.readinto(view[done:])
        if not got:
            raise DamagedFile("it ends early")
        done += got
    return tensor


def _byte_view(tensor: torch.Tensor):
    """A contiguous tensor's bytes as a numpy array sharing its memory (a 0-dim tensor too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()
