"""The stored weights' file format (loading/tensor_file.py): plain safetensors, written and read with plain
file I/O. Damage of any kind is DamagedFile, never another exception and never an allocation larger than the
file; an I/O failure is an OSError with its errno; tensors come back equal and 64-byte aligned."""

from __future__ import annotations

import errno
import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from specchat.cache_folder import DamagedFile
from specchat.loading import tensor_file
from specchat.loading.tensor_file import read_tensors, write_tensors


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {
        "layer.weight": torch.randint(-127, 128, (17, 64), dtype=torch.int8, generator=generator),
        "layer.scale": torch.rand(17, generator=generator),
        "layer.outs": torch.tensor(17),
        "head.qs": torch.randint(0, 256, (2, 4, 256), dtype=torch.uint8, generator=generator),
        "half": torch.rand(3, 5, generator=generator).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_what_is_written_reads_back_and_is_a_safetensors_file(tmp_path):
    tensors = _tensors()
    write_tensors(tmp_path / "ours.safetensors", tensors)
    read = read_tensors(tmp_path / "ours.safetensors")
    assert _same(read, tensors) and _same(load_file(str(tmp_path / "ours.safetensors")), tensors)
    assert all(t.data_ptr() % 64 == 0 for t in read.values() if t.numel())
    save_file(tensors, str(tmp_path / "theirs.safetensors"))
    assert _same(read_tensors(tmp_path / "theirs.safetensors"), tensors)


def test_a_missing_or_unreadable_file_is_an_os_error_with_its_errno(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as missing:
        read_tensors(tmp_path / "none.safetensors")
    assert missing.value.errno == errno.ENOENT  # safetensors' own load_file gives this without an errno
    write_tensors(tmp_path / "w.safetensors", _tensors())

    def failing(src, tensor):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tensor_file, "_read_into", failing)
    with pytest.raises(OSError) as failed:
        read_tensors(tmp_path / "w.safetensors")
    assert failed.value.errno == errno.EIO and not isinstance(failed.value, DamagedFile)


def _with_header(header: dict, data: bytes = b"\0" * 16) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


HOSTILE = {
    "a huge shape in 8 bytes": {"x": {"dtype": "F32", "shape": [1 << 30, 1 << 30], "data_offsets": [0, 8]}},
    "offsets past the end": {"x": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}},
    "negative offsets": {"x": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}},
    "an unknown dtype": {"x": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 4]}},
    "a float dimension": {"x": {"dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]}},
    "a huge empty shape": {"x": {"dtype": "U8", "shape": [0, 1 << 62], "data_offsets": [0, 0]}},
    "no table": [1, 2, 3],
    "an entry not a table": {"x": "U8"},
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_header_is_damage_before_anything_is_allocated(case, tmp_path):
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(_with_header(HOSTILE[case]))
    with pytest.raises(DamagedFile):
        read_tensors(path)


def test_a_header_longer_than_the_file_is_damage(tmp_path):
    path = tmp_path / "long.safetensors"
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(DamagedFile, match="more than the file holds"):
        read_tensors(path)


def test_every_cut_and_a_thousand_flipped_bytes_are_damage_or_a_whole_read(tmp_path):
    """Never another exception: a cut anywhere, or a byte changed anywhere (the header included)."""
    tensors = _tensors()
    good = tmp_path / "good.safetensors"
    write_tensors(good, tensors)
    data, path, rng = good.read_bytes(), tmp_path / "bad.safetensors", random.Random(7)
    cases = [data[:cut] for cut in range(0, len(data), 97)]
    for _ in range(1000):
        mutated = bytearray(data)
        mutated[rng.randrange(min(len(data), 600))] = rng.randrange(256)  # mostly in the header
        cases.append(bytes(mutated))
    outcomes = {"damaged": 0, "read": 0}
    for case in cases:
        path.write_bytes(case)
        try:
            read = read_tensors(path)
        except DamagedFile:
            outcomes["damaged"] += 1
            continue
        outcomes["read"] += 1
        assert sum(t.numel() * t.element_size() for t in read.values()) <= len(case)
    assert outcomes["damaged"] > 0 and outcomes["read"] > 0, outcomes
