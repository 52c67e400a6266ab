"""An untrusted GGUF file (loading/gguf/header.py, gguf/tensors.py, gguf/blocks.py, gguf/convert.py): each kind of
truncation or malformed field is one ModelLoadError line naming the file, found before anything is read or allocated
for it, and 1,000 seeded random truncations and mutations of a real small file give nothing else (issue 48, item 6)."""

from __future__ import annotations

import collections
import io
import random
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from model_files import tiny_qwen2, write_gguf
from tiny_models import build_tokenizer

from specchat.config import ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading.gguf import header
from specchat.loading.gguf.blocks import decode_q4_k
from specchat.loading.gguf.header import read_tensors
from specchat.loading.gguf.tensors import GGUFTensors

HUGE = (2**63, 2**64 - 1, 2**40, 2**32 + 7)
FUZZ_CASES = 1000
MEMORY_SLACK = 64 * 1024  # the parser's own objects (the tensor table, an exception and its message)
STORED = {"token_embd.weight": GGMLQuantizationType.Q8_0, "blk.0.ffn_up.weight": GGMLQuantizationType.Q8_0}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def real(tmp_path_factory, tok):
    """(the bytes of a real small GGUF written by the gguf package, where each field of its header lies)."""
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_qwen2(len(tok), seed=7), tok, stored=STORED)
    return path.read_bytes(), field_spots(path)


def field_spots(path: Path) -> dict[str, list[int]]:
    """Byte positions of the header's fields by kind, as gguf-py's reader finds them (u64 lengths and counts,
    u32 value types, and each tensor's dimension count, dimensions, type and offset)."""
    reader = GGUFReader(str(path))
    spots = collections.defaultdict(list, {"length": [8, 16], "header_end": [reader.data_offset]})
    for key, field in reader.fields.items():
        starts = np.cumsum([field.offset] + [part.nbytes for part in field.parts]).tolist()
        if key.startswith("GGUF."):
            continue
        spots["length"].append(starts[0])
        spots["type"].append(starts[2])
        spots["key:" + key].append(starts[0])
        if field.types[0] == GGUFValueType.STRING:
            spots["length"].append(starts[3])
        elif field.types[0] == GGUFValueType.ARRAY:
            spots["type"].append(starts[3])
            spots["length"].append(starts[4])
            if field.types[1] == GGUFValueType.STRING:
                spots["length"].extend(starts[5:-1:2])
    for tensor in reader.tensors:
        starts = np.cumsum([tensor.field.offset] + [part.nbytes for part in tensor.field.parts]).tolist()
        spots["length"].append(starts[0])
        spots["name"].append(starts[0])
        spots["n_dims"].append(starts[2])
        spots["dim"].extend(range(starts[3], starts[4], 8))
        spots["tensor_type"].append(starts[4])
        spots["offset"].append(starts[5])
    return spots


def patched(data: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def as_alignment(data: bytes, spots: dict, value: int) -> bytes:
    """The file with its u32 general.file_type renamed general.alignment (the same length) and set to `value`."""
    at = spots["key:general.file_type"][0]
    out = bytearray(data)
    out[at + 8 : at + 25] = b"general.alignment"
    struct.pack_into("<I", out, at + 29, value)
    return bytes(out)


def refused(path: Path, match: str) -> str:
    with pytest.raises(ModelLoadError, match=match) as err:
        read_tensors(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


# ----- each kind of damage, one line ------------------------------------------------------------------------------
def _offset(spots, i):
    return spots["offset"][i]


CASES = {  # name: (the damaged file from (bytes, spots), what the line says)
    "empty": (lambda d, s: b"", "0 bytes long, shorter than a GGUF header"),
    "cut in the header": (lambda d, s: d[:100], "runs past the end of the file|more than the rest of the file"),
    "cut in the tensor data": (
        lambda d, s: d[: len(d) - 1000],
        r"tensor \S+ \(\d+ bytes at byte \d+\) runs past the end",
    ),
    "no magic": (lambda d, s: b"GGML" + d[4:], "no GGUF magic"),
    "version 1": (lambda d, s: patched(d, 4, "<I", 1), "GGUF version 1; versions 2 and 3"),
    "huge tensor count": (lambda d, s: patched(d, 8, "<Q", 2**62), "the tensor count is 4611686018427387904, more"),
    "huge key count": (lambda d, s: patched(d, 16, "<Q", 2**40), "the metadata key count is 1099511627776, more"),
    "huge key length": (
        lambda d, s: patched(d, s["length"][2], "<Q", 2**63),
        "metadata key 0 is 9223372036854775808 bytes long; at most 65535",
    ),
    "huge string length": (
        lambda d, s: patched(d, s["key:general.name"][0] + 8 + 12 + 4, "<Q", 2**64 - 1),
        "general.name is a string of 18,446,744,073,709,551,615 bytes, more than 16,777,216",
    ),
    "a string past the end": (
        lambda d, s: patched(d, s["key:general.name"][0] + 8 + 12 + 4, "<Q", len(d)),
        "general.name .* runs past the end of the file",
    ),
    "a 1 GB token": (
        lambda d, s: patched(d, s["key:tokenizer.ggml.tokens"][0] + 8 + 21 + 8 + 8, "<Q", 2**30),
        "string 0 of tokenizer.ggml.tokens is 1,073,741,824 bytes long, more than 1,048,576",
    ),
    "huge array count": (
        lambda d, s: patched(d, s["key:tokenizer.ggml.tokens"][0] + 8 + 21 + 8, "<Q", 2**62),
        "the item count of tokenizer.ggml.tokens is 4611686018427387904, more than",
    ),
    "value type 13": (
        lambda d, s: patched(d, s["key:general.name"][0] + 8 + 12, "<I", 13),
        "general.name has value type 13, which GGUF does not define",
    ),
    "array item type 99": (
        lambda d, s: patched(d, s["key:tokenizer.ggml.tokens"][0] + 8 + 21 + 4, "<I", 99),
        "tokenizer.ggml.tokens is an array of value type 99",
    ),
    "architecture not a string": (
        lambda d, s: patched(d, s["key:general.architecture"][0] + 8 + 20, "<I", 4),
        "general.architecture has value type 4, not a string",
    ),
    "5 dimensions": (lambda d, s: patched(d, s["n_dims"][0], "<I", 5), "has 5 dimensions; 1 to 4 are allowed"),
    "2**32-1 dimensions": (lambda d, s: patched(d, s["n_dims"][0], "<I", 2**32 - 1), "4294967295 dimensions"),
    "a dimension of 0": (lambda d, s: patched(d, s["dim"][0], "<Q", 0), "has a dimension of 0"),
    "a huge dimension": (lambda d, s: patched(d, s["dim"][0], "<Q", 2**63), "more than the whole file"),
    "unknown tensor type": (lambda d, s: patched(d, s["tensor_type"][0], "<I", 4), "has type 4, which this gguf"),
    "rows not whole blocks": (
        lambda d, s: patched(d, s["dim"][0], "<Q", 48),  # token_embd is Q8_0: 32-value blocks
        "token_embd.weight is Q8_0 with rows of 48 values, not a whole number of its 32-value",
    ),
    "offset past the end": (lambda d, s: patched(d, _offset(s, 3), "<Q", len(d)), "runs past the end of the file"),
    "offset 2**64-32": (lambda d, s: patched(d, _offset(s, 3), "<Q", 2**64 - 32), "runs past the end of the file"),
    "offset not aligned": (
        lambda d, s: patched(d, _offset(s, 3), "<Q", struct.unpack_from("<Q", d, _offset(s, 3))[0] + 4),
        "not a multiple of the alignment \\(32\\)",
    ),
    "overlapping tensors": (
        lambda d, s: patched(d, _offset(s, 3), "<Q", struct.unpack_from("<Q", d, _offset(s, 2))[0]),
        "tensors .* and .* overlap",
    ),
    "a name given twice": (lambda d, s: _same_name(d, s), "tensor blk.0.attn_q.weight appears twice"),
    "a name of 2**20 bytes": (lambda d, s: patched(d, s["name"][0], "<Q", 2**20), "is 1048576 bytes long; at most 64"),
    "alignment 0": (lambda d, s: as_alignment(d, s, 0), "general.alignment is 0, not a power of two"),
    "alignment 48": (lambda d, s: as_alignment(d, s, 48), "general.alignment is 48, not a power of two"),
    "arrays nested 10,000 deep": (lambda d, s: _nested(10_000), "nests arrays more than 2 deep"),
}


def _same_name(data: bytes, spots: dict) -> bytes:
    """blk.0.attn_k.weight renamed blk.0.attn_q.weight (the same length)."""
    at = data.index(b"blk.0.attn_k.weight", 24, spots["header_end"][0])
    return data[:at] + b"blk.0.attn_q.weight" + data[at + 19 :]


def _nested(depth: int) -> bytes:
    """A GGUF of no tensors and one key whose value is an array of arrays of arrays ... `depth` deep."""
    key = b"x"
    return (
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key))
        + key
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 9, 1) * depth
        + struct.pack("<IQ", 0, 0)
    )


@pytest.mark.parametrize("case", list(CASES))
def test_each_kind_of_damage_is_one_line_naming_the_file_and_what_is_wrong(real, tmp_path, case):
    damage, message = CASES[case]
    path = tmp_path / "damaged.gguf"
    path.write_bytes(damage(*real))
    refused(path, message)


def test_the_real_file_reads_and_an_unreadable_one_is_one_line(real, tmp_path):
    path = tmp_path / "whole.gguf"
    path.write_bytes(real[0])
    facts, tensors = read_tensors(path)
    assert (
        facts["general.architecture"] == "qwen2"
        and facts["tokenizer.ggml.tokens.count"] == 384
        and len(tensors) == len(real[1]["offset"])
    )
    with pytest.raises(ModelLoadError, match=f"cannot read {tmp_path}: Is a directory"):
        read_tensors(tmp_path)


def test_inside_a_load_a_header_is_read_once_while_its_file_is_unchanged(real, tmp_path, monkeypatch):
    """kept_headers(): a load's many reads of one file parse it once; a file written again is read again, and
    outside the block every read reads (a rewrite within one timestamp tick is never mistaken for the old file)."""
    path = tmp_path / "whole.gguf"
    path.write_bytes(real[0])
    parses = []
    parse = header._read_header
    monkeypatch.setattr(header, "_read_header", lambda p: parses.append(p) or parse(p))
    with header.kept_headers():
        first, again = read_tensors(path), read_tensors(path)
        assert len(parses) == 1 and first == again and first[0] is not again[0]  # each caller's own dict
        path.write_bytes(real[0] + b"\0" * 64)  # another size: another version of the file
        read_tensors(path)
        assert len(parses) == 2
    read_tensors(path)
    read_tensors(path)
    assert len(parses) == 4


def test_a_file_cut_short_after_its_header_was_read_is_one_line(real, tmp_path):
    path = tmp_path / "shrinking.gguf"
    path.write_bytes(real[0])
    _, tensors = read_tensors(path)
    path.write_bytes(real[0][: tensors[-1].start + 10])
    with pytest.raises(ModelLoadError, match=f"{tensors[-1].name} needs {tensors[-1].nbytes} bytes .* holds 10 of"):
        _ = tensors[-1].data


# ----- the fuzz ---------------------------------------------------------------------------------------------------
def mutation(data: bytes, spots: dict, rng: random.Random) -> tuple[str, bytes]:
    """One random damage of the file: (its kind, the damaged bytes)."""
    header_end = spots["header_end"][0]
    kind = rng.choice(["truncate", "truncate-header", "flip", "length", "type", "tensor", "offset", "alignment"])
    if kind == "truncate":
        return kind, data[: rng.randrange(len(data))]
    if kind == "truncate-header":
        return kind, data[: rng.randrange(header_end)]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(header_end)] = rng.randrange(256)
        return kind, bytes(out)
    if kind == "length":
        return kind, patched(data, rng.choice(spots["length"]), "<Q", rng.choice(HUGE + (rng.randrange(2**64),)))
    if kind == "type":
        return kind, patched(
            data, rng.choice(spots["type"]), "<I", rng.choice((13, 255, 2**32 - 1, rng.randrange(2**32)))
        )
    if kind == "tensor":
        field = rng.choice(["n_dims", "dim", "tensor_type"])
        fmt = "<Q" if field == "dim" else "<I"
        return kind, patched(data, rng.choice(spots[field]), fmt, rng.choice((0, 5, 2**31, rng.randrange(2**32))))
    if kind == "offset":
        values = (len(data), 2**64 - 1, rng.randrange(2**64), rng.randrange(len(data)), rng.randrange(64))
        return kind, patched(data, rng.choice(spots["offset"]), "<Q", rng.choice(values))
    return kind, as_alignment(data, spots, rng.choice((0, 1, 3, 48, 64, 2**31, 2**32 - 1, rng.randrange(2**32))))


def outcome(path: Path, size: int) -> tuple[str, int]:
    """("refused" or "read", the peak bytes the read allocated); anything but a one-line ModelLoadError is raised."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        _, tensors = read_tensors(path)
    except ModelLoadError as err:
        assert "\n" not in str(err) and str(path) in str(err), str(err)
        return "refused", tracemalloc.get_traced_memory()[1] - before
    peak = tracemalloc.get_traced_memory()[1] - before
    ends = sorted((t.start, t.start + t.nbytes) for t in tensors)
    assert all(end <= size for _, end in ends) and all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))
    for tensor in tensors:
        assert tensor.data.size * tensor.data.itemsize == tensor.nbytes
    return "read", peak


def test_a_thousand_random_truncations_and_mutations_are_each_one_line_or_a_whole_read(real, tmp_path):
    data, spots = real
    rng = random.Random(48)
    path = tmp_path / "fuzzed.gguf"
    path.write_bytes(data)
    read_tensors(path)  # gguf's import and numpy's first allocations, before memory is traced
    counts, worst = collections.Counter(), 0.0
    tracemalloc.start()
    try:
        for _ in range(FUZZ_CASES):
            kind, damaged = mutation(data, spots, rng)
            path.write_bytes(damaged)
            result, peak = outcome(path, len(damaged))
            assert peak <= len(damaged) + MEMORY_SLACK, (kind, result, peak, len(damaged))
            counts[kind, result] += 1
            worst = max(worst, peak / max(len(damaged), 1))
    finally:
        tracemalloc.stop()
    print(
        f"\nGGUF header fuzz: {FUZZ_CASES} cases, {sum(v for (k, r), v in counts.items() if r == 'refused')} refused "
        f"in one line, the rest read whole; by kind: {dict(sorted(counts.items()))}"
    )
    assert sum(counts.values()) == FUZZ_CASES
    assert sum(v for (k, r), v in counts.items() if r == "refused") >= FUZZ_CASES // 2  # the fuzz bites


# ----- where tensor data is then used -----------------------------------------------------------------------------
def test_a_tensor_that_contradicts_the_files_own_config_is_one_line_before_any_read(real, tmp_path, tok):
    path = tmp_path / "whole.gguf"
    path.write_bytes(real[0])
    other = tiny_qwen2(len(tok) + 32, seed=7)  # the config a damaged vocabulary size would make
    with pytest.raises(
        ModelLoadError,
        match=r"contradicts itself: tensor token_embd.weight is \[384, 64\], but its "
        r"own config makes model.embed_tokens.weight \[416, 64\]",
    ):
        GGUFTensors(path, other)


def test_a_tensor_the_model_needs_but_the_file_lacks_is_one_line(real, tmp_path, tok):
    path = tmp_path / "whole.gguf"
    path.write_bytes(real[0])
    tensors = GGUFTensors(path, tiny_qwen2(len(tok), seed=7))
    with pytest.raises(ModelLoadError, match=f"{path} has no tensor for model.layers.9.mlp.up_proj.weight"):
        tensors.info("model.layers.9.mlp.up_proj.weight")


def test_q4_k_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match=r"Q4_K blocks are uint8 \[rows, blocks·144\], got torch.uint8 \[2, 100\]"):
        decode_q4_k(torch.zeros(2, 100, dtype=torch.uint8))


@pytest.mark.parametrize("quantization", ["none", "w4a8"])
def test_a_damaged_gguf_source_is_one_line_at_load_and_at_the_cli(real, tmp_path, monkeypatch, request, quantization):
    """`target.source=bad.gguf`: through models.load_model (the w4a8 modes read the header to choose a slim
    conversion, the others convert through transformers) and the CLI, one line, no traceback."""
    from specchat.loading import models, plan
    from specchat.tui.cli import main

    if quantization == "w4a8":
        request.getfixturevalue("kernel")  # built (once) in the real cache, not again in this test's
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plan, "resolve_device", lambda device: "cpu")
    path = tmp_path / "cut.gguf"
    path.write_bytes(real[0][: len(real[0]) // 2])
    with pytest.raises(ModelLoadError, match=f"{path} is not a readable GGUF file: tensor .* runs past the end"):
        models.load_model(ModelConfig(source=str(path), dtype="float32", quantization=quantization))
    err = io.StringIO()
    status = main(
        [
            "--prompt",
            "hi",
            f"target.source={path}",
            f"drafter.source={path}",
            f"target.quantization={quantization}",
            f"drafter.quantization={quantization}",
        ],
        stdin=io.StringIO(),
        stdout=io.StringIO(),
        stderr=err,
    )
    assert status == 1 and err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    assert err.getvalue().startswith(f"specchat: error: {path} is not a readable GGUF file: tensor ")
