"""A GGUF file's tensor table, read in a tenth of a second, every byte of it checked before it is used.

gguf-py's GGUFReader parses every metadata value through numpy memmap slices: 15 s for the bundled drafter,
most of it its 151,936-token vocabulary. specchat needs only the architecture and where each tensor lies, so
it walks the header with struct and skips every other value (format: ggml's GGUF specification, versions 2 and 3).

The file is untrusted: each count, length, type, dimension, alignment and offset is checked against the
format and the file's size before anything is read or allocated for it, and whatever is wrong is one
ModelLoadError line naming the file, never a struct.error, KeyError, ZeroDivisionError or RecursionError.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from specchat.errors import ModelLoadError
from specchat.loading.gguf.shared_patch import SharedPatch

# metadata value types of fixed width (u8 i8 u16 i16 u32 i32 f32 bool, u64 i64 f64); 8 is a string, 9 an array
WIDTHS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)
UNSIGNED = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}  # a value's bits by its width (floats too: only integers are used)
HEADER_BYTES = 24  # magic, version, tensor count, value count
MAX_KEY_BYTES = 65535  # the GGUF specification: a key is at most 2^16-1 bytes
MAX_NAME_BYTES = (
    64  # the GGUF specification: a tensor name is at most 64 bytes (ggml's GGML_MAX_NAME); the architecture too
)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ITEM_STRING_BYTES = 1 << 20  # a string in an array (a vocabulary's token, a merge): far above any real one
MAX_STRING_BYTES = 1 << 24  # a string value (a chat template: the longest seen are tens of kilobytes)
MAX_NESTING = 2  # an array of arrays is allowed, an array of arrays of arrays is not (no GGUF writes one)
MAX_TENSORS = 1 << 20  # far above any model's (the bundled 1.5B has 339)
MAX_VALUES = 1 << 16  # metadata keys (a model has about 30)
MIN_VALUE_BYTES = 8 + 4 + 1  # the smallest key-value pair: an empty key, its type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # the smallest tensor entry: an empty name, one dimension, type, offset
DEFAULT_ALIGNMENT = 32
FACTS = ("general.architecture", "general.alignment")
HEAD_SIZE = (
    ".attention.key_length"  # `<architecture>.attention.key_length`, read where it is an integer (gguf/config.py)
)
NUMBERS = (  # `<architecture><suffix>`, read where it is an integer or a float: Phi-3's (gguf/phi3.py)
    ".rope.scaling.original_context_length",
    ".rope.scaling.attn_factor",
    ".rope.dimension_count",
    ".attention.sliding_window",
    ".rope.scaling.factor",  # Gemma-3's global layers' (gguf/gemma.py)
    ".context_length",  # the KV cache at the context limit (loading/memory_need.py)
)
SPECIAL_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")  # read where integers: checked in range
TOKENS = "tokenizer.ggml.tokens"  # its item count is read (TOKEN_COUNT), every token skipped
TOKEN_COUNT = "tokenizer.ggml.tokens.count"
TOKENIZER_DIGEST = "tokenizer.digest"  # sha256 of what makes the tokenizer: every tokenizer.* key and the architecture
CHAT_TEMPLATE = "tokenizer.chat_template"  # its bytes are read (a string value), in the digest only as present
STRINGS = (".rope.scaling.type",)  # `<architecture><suffix>`, read where it is a string (gguf/gemma.py)
FLOATS = {6: "<f", 12: "<d"}  # f32, f64


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file, its parts named as gguf-py's ReaderTensor names them."""

    name: str
    shape: tuple[int, ...]  # ggml order: the fastest-moving dimension (a row's width) first
    tensor_type: object  # gguf.GGMLQuantizationType
    path: Path
    start: int  # byte offset in the file
    rows: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def data(self) -> np.ndarray:
        """The stored values or blocks ([rows, bytes a row]), read from the file now: read, not mapped, so the
        pages are the system's page cache and not this process's resident set."""
        try:
            data = np.fromfile(self.path, dtype=np.uint8, count=self.nbytes, offset=self.start)
        except OSError as err:
            raise ModelLoadError(
                f"cannot read tensor {shown(self.name)} of {self.path}: {err.strerror or err}"
            ) from err
        if data.size != self.nbytes:  # the file was cut short after its header was read
            raise ModelLoadError(
                f"{self.path} is not a readable GGUF file: tensor {shown(self.name)} needs {self.nbytes} "
                f"bytes at {self.start}, the file now holds {data.size} of them"
            )
        return _shaped(data, self.tensor_type, self.shape, self.rows)

    def mapped_blocks(self) -> np.ndarray:
        """The stored bytes as uint8 [rows, bytes a row], mapped read-only (unmapped once let go): for a reader of
        each byte once (file_tiles.py's tiler), no copy into fresh memory. ValueError where the file is now shorter
        than the entry says; OSError where it cannot be opened."""
        mapped = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.start, shape=(self.nbytes,))
        return mapped.reshape(self.rows, self.row_bytes)


Header = tuple[dict, list[TensorEntry]]  # what read_tensors returns: the facts, and the tensors in file order


class _Cursor:
    """The file's bytes and a position in them: every read is checked to lie inside the file first."""

    def __init__(self, blob: np.ndarray, path: Path):
        self.blob, self.path, self.pos = blob, path, 0

    def fail(self, problem: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path} is not a readable GGUF file: {problem}")

    def left(self) -> int:
        return len(self.blob) - self.pos

    def skip(self, size: int, what: str) -> None:
        if size > self.left():
            raise self.fail(
                f"{what} ({size} bytes at byte {self.pos}) runs past the end of the file ({len(self.blob)} bytes)"
            )
        self.pos += size

    def take(self, fmt: str, what: str) -> tuple:
        start = self.pos
        self.skip(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.blob, start)

    def string(self, what: str, limit: int | None = None) -> str:
        """A GGUF string (u64 length, bytes), decoded; over `limit` bytes is refused before it is copied."""
        (length,) = self.take("<Q", f"the length of {what}")
        if limit is not None and length > limit:
            raise self.fail(f"{what} is {length} bytes long; at most {limit} are allowed")
        start = self.pos
        self.skip(length, what)
        return bytes(self.blob[start : self.pos]).decode("utf-8", errors="replace")

    def count(self, fmt: str, what: str, limit: int, each_at_least: int) -> int:
        """A count, refused when above `limit` or when its items could not fit in the rest of the file."""
        (n,) = self.take(fmt, what)
        if n > limit or n * each_at_least > self.left():
            raise self.fail(f"{what} is {n}, more than {'the rest of the file holds' if n <= limit else limit}")
        return n


class _KeptHeaders:
    """The headers read inside kept_headers() blocks, by the identity of the file's version (_identity)."""

    def __init__(self) -> None:
        self.on = False
        self.headers: dict[tuple, Header] = {}

    def keep(self) -> None:
        self.on = True

    def forget(self) -> None:
        self.on = False
        self.headers.clear()


_kept = _KeptHeaders()
_KEEPING = SharedPatch(_kept.keep, _kept.forget)


def kept_headers():
    """Within the block (a model's load: its conversion and its tiling read each GGUF's header up to 7 times, 0.13 s
    each for the bundled target), a file read before and unchanged since (the same inode, size, mtime and ctime) is
    not read again. Outside, every read reads: a file written again within a timestamp's tick is never mistaken."""
    return _KEEPING.held()


def read_tensors(path: Path) -> Header:
    """({"general.architecture": ..., "general.alignment": ...} where the file has them, the tensors in file
    order); a file that is not a whole, well-formed GGUF is one ModelLoadError naming it and what is wrong.
    Inside kept_headers(), a file's header is read once."""
    path = Path(path)
    identity = _identity(path) if _kept.on else None
    header = _kept.headers.get(identity) if identity is not None else None
    if header is None:
        header = _read_header(path)
        if identity is not None:
            _kept.headers[identity] = header
    return dict(header[0]), list(header[1])  # the caller's to change


def _identity(path: Path) -> tuple | None:
    """What tells a file's version apart; None where it cannot be looked at (the read then says why)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _read_header(path: Path) -> Header:
    cursor = _Cursor(_mapped(path), path)
    tensor_count, value_count = _preamble(cursor)
    facts = _read_values(cursor, value_count)
    table = _read_table(cursor, tensor_count)
    alignment = _alignment(cursor, facts)
    start = (cursor.pos + alignment - 1) // alignment * alignment
    tensors = [
        TensorEntry(name, dims, GGMLQuantizationType(kind), path, start + offset, rows, row_bytes)
        for name, dims, kind, offset, rows, row_bytes in table
    ]
    _check_placement(cursor, tensors, start, alignment)
    return facts, tensors


def shown(text: str, limit: int = 64) -> str:
    """Text from the file as a message may quote it: control and other unprintable characters escaped, cut
    at `limit` characters."""
    cut = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return cut + ("…" if len(text) > limit else "")


def _mapped(path: Path) -> np.ndarray:
    """The file's bytes, mapped (nothing is read until used)."""
    try:
        size = path.stat().st_size
        if size < HEADER_BYTES:
            raise ModelLoadError(
                f"{path} is not a readable GGUF file: it is {size} bytes long, "
                f"shorter than a GGUF header ({HEADER_BYTES} bytes)"
            )
        return np.memmap(path, mode="r").view(np.ndarray)
    except OSError as err:
        raise ModelLoadError(f"cannot read {path}: {err.strerror or err}") from err


def _preamble(cursor: _Cursor) -> tuple[int, int]:
    """(tensor count, metadata value count), after the magic and version are checked."""
    if bytes(cursor.blob[:4]) != b"GGUF":
        raise cursor.fail("no GGUF magic at its start")
    cursor.pos = 4
    (version,) = cursor.take("<I", "the version")
    if version not in (2, 3):
        raise cursor.fail(f"GGUF version {version}; versions 2 and 3 are read")
    tensor_count = cursor.count("<Q", "the tensor count", MAX_TENSORS, MIN_TENSOR_BYTES)
    value_count = cursor.count("<Q", "the metadata key count", MAX_VALUES, MIN_VALUE_BYTES)
    return tensor_count, value_count


def _read_values(cursor: _Cursor, count: int) -> dict:
    """The FACTS the file has (the architecture as a string, the alignment as an integer), an integer head size
    (HEAD_SIZE), the NUMBERS and the STRINGS; every other value skipped. TOKENIZER_DIGEST: the sha256 of the bytes
    (key, type and value) of every tokenizer.* key and the architecture's, in file order, the chat template's key
    and type alone (its text: CHAT_TEMPLATE, bytes)."""
    facts, tokenizer = {}, hashlib.sha256()
    for index in range(count):
        start = cursor.pos
        key = cursor.string(f"metadata key {index}", MAX_KEY_BYTES)
        label = shown(key)
        (kind,) = cursor.take("<I", f"the type of {label}")
        if key == "general.architecture" and kind == STRING:
            facts[key] = cursor.string(key, MAX_NAME_BYTES)
        elif key == "general.alignment" and kind in INTEGERS:
            facts[key] = cursor.take(UNSIGNED[WIDTHS[kind]], key)[0]  # the bits, unsigned
        elif key in SPECIAL_IDS and kind in INTEGERS:
            facts[key] = cursor.take(UNSIGNED[WIDTHS[kind]], key)[0]
        elif key == TOKENS and kind == ARRAY:
            facts[TOKEN_COUNT] = _item_count(cursor)
            _skip_value(cursor, kind, label, 0)
        elif key.endswith(HEAD_SIZE) and kind in INTEGERS:
            facts[key] = cursor.take(UNSIGNED[WIDTHS[kind]], label)[0]
        elif key.endswith(NUMBERS) and (kind in INTEGERS or kind in FLOATS):
            facts[key] = cursor.take(FLOATS.get(kind) or UNSIGNED[WIDTHS[kind]], label)[0]
        elif key.endswith(STRINGS) and kind == STRING:
            facts[key] = cursor.string(label, MAX_NAME_BYTES)
        elif key == CHAT_TEMPLATE and kind == STRING:
            value = cursor.pos
            _skip_value(cursor, kind, label, 0)
            facts[key], cursor.pos = bytes(cursor.blob[value + 8 : cursor.pos]), value  # hashed as present, below
        elif key in FACTS:
            raise cursor.fail(f"{label} has value type {kind}, not a {'string' if key.endswith('ture') else 'integer'}")
        else:
            _skip_value(cursor, kind, label, 0)
        if key.startswith("tokenizer.") or key == "general.architecture":
            tokenizer.update(memoryview(cursor.blob[start : cursor.pos]))
        if key == CHAT_TEMPLATE and kind == STRING:
            _skip_value(cursor, kind, label, 0)
    facts[TOKENIZER_DIGEST] = tokenizer.hexdigest()
    return facts


def _item_count(cursor: _Cursor) -> int:
    """The item count of the array that starts here (its item type, then its count), the cursor left in place."""
    start = cursor.pos
    cursor.take("<I", "an array's item type")
    (count,) = cursor.take("<Q", "an array's item count")
    cursor.pos = start
    return int(count)


def _skip_value(cursor: _Cursor, kind: int, what: str, depth: int) -> None:
    """Step over one metadata value of type `kind`, arrays (nested at most MAX_NESTING deep) included."""
    if kind in WIDTHS:
        cursor.skip(WIDTHS[kind], what)
    elif kind == STRING:
        (length,) = cursor.take("<Q", f"the length of {what}")
        if length > MAX_STRING_BYTES:
            raise cursor.fail(f"{what} is a string of {length:,} bytes, more than {MAX_STRING_BYTES:,}")
        cursor.skip(length, what)
    elif kind == ARRAY:
        if depth >= MAX_NESTING:
            raise cursor.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        (item,) = cursor.take("<I", f"the item type of {what}")
        if item not in WIDTHS and item not in (STRING, ARRAY):
            raise cursor.fail(f"{what} is an array of value type {item}, which GGUF does not define")
        smallest = WIDTHS.get(item, 8 if item == STRING else 12)
        n = cursor.count("<Q", f"the item count of {what}", cursor.left(), smallest)
        if item in WIDTHS:
            cursor.skip(WIDTHS[item] * n, what)
        elif item == STRING:
            _skip_strings(cursor, n, what)
        else:
            for _ in range(n):
                _skip_value(cursor, item, what, depth + 1)
    else:
        raise cursor.fail(f"{what} has value type {kind}, which GGUF does not define")


def _skip_strings(cursor: _Cursor, n: int, what: str) -> None:
    """Step over n strings (a vocabulary: 151,936 of them in the bundled models), each length checked."""
    blob, pos, size = cursor.blob, cursor.pos, len(cursor.blob)
    for index in range(n):
        if pos + 8 > size:
            break
        length = struct.unpack_from("<Q", blob, pos)[0]
        if length > MAX_ITEM_STRING_BYTES:
            raise cursor.fail(f"string {index} of {what} is {length:,} bytes long, more than {MAX_ITEM_STRING_BYTES:,}")
        pos += 8 + length
        if pos > size:
            break
    else:
        cursor.pos = pos
        return
    raise cursor.fail(f"string {index} of {what} runs past the end of the file ({size} bytes)")


def _read_table(cursor: _Cursor, count: int) -> list[tuple]:
    """[(name, dims, type, offset, rows, bytes a row)] of every tensor, each entry checked as it is read."""
    known = {kind.value: GGML_QUANT_SIZES[kind] for kind in GGMLQuantizationType if kind in GGML_QUANT_SIZES}
    table, names = [], set()
    for index in range(count):
        name = cursor.string(f"the name of tensor {index}", MAX_NAME_BYTES)
        label = shown(name)
        if name in names:
            raise cursor.fail(f"tensor {label} appears twice")
        names.add(name)
        (n_dims,) = cursor.take("<I", f"the dimension count of tensor {label}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cursor.fail(f"tensor {label} has {n_dims} dimensions; 1 to {MAX_DIMS} are allowed")
        dims = cursor.take(f"<{n_dims}Q", f"the dimensions of tensor {label}")
        kind, offset = cursor.take("<IQ", f"the type and offset of tensor {label}")
        if kind not in known:
            raise cursor.fail(f"tensor {label} has type {kind}, which this gguf package does not know")
        rows, row_bytes = _extent(cursor, label, dims, GGMLQuantizationType(kind), known[kind])
        table.append((name, dims, kind, offset, rows, row_bytes))
    return table


def _extent(cursor: _Cursor, label: str, dims: tuple[int, ...], kind, block_size: tuple[int, int]) -> tuple[int, int]:
    """(rows, bytes a row) of a tensor: every dimension at least 1, the row a whole number of blocks."""
    block, size = block_size
    if min(dims) < 1:
        raise cursor.fail(f"tensor {label} has a dimension of 0 ({list(dims)})")
    if dims[0] % block:
        raise cursor.fail(
            f"tensor {label} is {kind.name} with rows of {dims[0]} values, "
            f"not a whole number of its {block}-value blocks"
        )
    rows = 1
    for dim in dims[1:]:
        rows *= dim
    row_bytes = dims[0] // block * size
    if rows * row_bytes > len(cursor.blob):
        raise cursor.fail(
            f"tensor {label} ({kind.name} {list(dims)}) needs {rows * row_bytes} bytes, "
            f"more than the whole file ({len(cursor.blob)} bytes)"
        )
    return rows, row_bytes


def _alignment(cursor: _Cursor, facts: dict) -> int:
    alignment = int(facts.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment < 1 or alignment & (alignment - 1):
        raise cursor.fail(f"general.alignment is {alignment}, not a power of two")
    return alignment


def _check_placement(cursor: _Cursor, tensors: list[TensorEntry], start: int, alignment: int) -> None:
    """Each tensor's data aligned, inside the file, and clear of every other tensor's."""
    size = len(cursor.blob)
    end_of, last = start, None  # the first tensor starts at or after `start`: no overlap is possible
    for tensor in sorted(tensors, key=lambda t: t.start):
        if (tensor.start - start) % alignment:
            raise cursor.fail(
                f"tensor {shown(tensor.name)} starts at offset {tensor.start - start}, "
                f"not a multiple of the alignment ({alignment})"
            )
        if tensor.start + tensor.nbytes > size:
            raise cursor.fail(
                f"tensor {shown(tensor.name)} ({tensor.nbytes} bytes at byte {tensor.start}) runs past "
                f"the end of the file ({size} bytes)"
            )
        if tensor.start < end_of:
            raise cursor.fail(f"tensors {shown(last.name)} and {shown(tensor.name)} overlap (at byte {tensor.start})")
        end_of, last = tensor.start + tensor.nbytes, tensor


def _shaped(data: np.ndarray, kind, dims: tuple[int, ...], rows: int) -> np.ndarray:
    """Float tensors as their values in numpy order (as gguf-py gives them), blocks as [rows, bytes a row]."""
    floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    if kind in floats:
        return data.view(floats[kind]).reshape(tuple(reversed(dims)))
    return data.reshape(rows, -1)
