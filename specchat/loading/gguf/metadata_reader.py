"""A GGUF file's metadata as gguf-py's GGUFReader presents it to transformers' legacy metadata read
(`load_gguf_checkpoint` without tensors, which transformers still runs for a GGUF's config): `fields`, each
with the `types`, `parts` and `data` its parsing walks, and `tensors` by name. Read with struct from the
header's bytes: 0.1 s for the bundled target, where GGUFReader takes 5 s (a million numpy views of its
151,936-token vocabulary and merges).

Only the config comes from that read (transformers reads the tokenizer with its own reader), so the
tokenizer's arrays are walked past, not held: the vocabulary keeps its length (n empty strings, from which
the legacy read takes the config's vocab_size where the metadata states none), every other tokenizer array is
empty. The file is read after gguf/header.py has checked its counts and lengths; a value past the file's
end here is a struct.error, which the conversion reports as one line.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

# fixed-width value types (u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64); 8 is a string, 9 an array
FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
TOKENIZER = "tokenizer."  # arrays under this prefix are walked past
VOCABULARY = "tokenizer.ggml.tokens"  # ... this one keeping its length


@dataclass
class Field:
    """One value: item i is parts[data[i]], parsed as `types` says (transformers' _gguf_parse_value)."""

    types: list[int]
    parts: list
    data: list[int] | range


class MetadataReader:
    """What transformers' legacy read uses of a GGUFReader: `fields` by key, `tensors` with their names."""

    def __init__(self, path: str | Path):
        blob = np.memmap(path, mode="r", dtype=np.uint8)
        self.fields, self.tensors = read_fields(memoryview(blob))


def read_fields(blob: memoryview) -> tuple[dict[str, Field], list[SimpleNamespace]]:
    version, tensor_count, value_count = struct.unpack_from("<IQQ", blob, 4)
    pos, fields = (
        24,
        {  # as gguf-py's reader names the header's own numbers
            "GGUF.version": Field([4], [(version,)], [0]),
            "GGUF.tensor_count": Field([10], [(tensor_count,)], [0]),
            "GGUF.kv_count": Field([10], [(value_count,)], [0]),
        },
    )
    for _ in range(value_count):
        raw_key, pos = _string(blob, pos)
        key = raw_key.decode("utf-8")
        (kind,) = struct.unpack_from("<I", blob, pos)
        fields[key], pos = _field(blob, pos + 4, kind, key)
    tensors = []
    for _ in range(tensor_count):
        name, pos = _string(blob, pos)
        (dims,) = struct.unpack_from("<I", blob, pos)
        pos += 4 + 8 * dims + 4 + 8  # dimensions, type, offset
        tensors.append(SimpleNamespace(name=name.decode("utf-8")))
    return fields, tensors


def _field(blob: memoryview, pos: int, kind: int, key: str) -> tuple[Field, int]:
    if kind in FORMATS:
        (value,) = struct.unpack_from("<" + FORMATS[kind], blob, pos)
        return Field([kind], [(value,)], [0]), pos + struct.calcsize(FORMATS[kind])
    if kind == STRING:
        text, pos = _string(blob, pos)
        return Field([kind], [text], [0]), pos
    if kind != ARRAY:
        raise ValueError(f"a GGUF metadata value of type {kind}")
    item, count = struct.unpack_from("<IQ", blob, pos)
    pos += 12
    if item == ARRAY:
        raise ValueError(f"{key} is an array of arrays")
    walked_past = key.startswith(TOKENIZER)
    if item in FORMATS:
        width = struct.calcsize(FORMATS[item])
        values = () if walked_past else struct.unpack_from(f"<{count}{FORMATS[item]}", blob, pos)
        return Field([ARRAY, item], [(value,) for value in values], range(len(values))), pos + count * width
    if item != STRING:
        raise ValueError(f"{key} is an array of type {item}")
    if walked_past:
        for _ in range(count):
            (length,) = struct.unpack_from("<Q", blob, pos)
            pos += 8 + length
        return Field([ARRAY, STRING], [b""], [0] * count if key == VOCABULARY else []), pos
    texts = []
    for _ in range(count):
        text, pos = _string(blob, pos)
        texts.append(text)
    return Field([ARRAY, STRING], texts, range(len(texts))), pos


def _string(blob: memoryview, pos: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    return bytes(blob[pos : pos + length]), pos + length
