"""The cache folder: one builder per cache artefact (the second process, here a thread, waits, saying so, then
finds it built); a private root (created 0700, refused where others could write); stamps skipped where the disk
refuses them; disk errors in one line; renames fsynced."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest

from specchat import cache_folder
from specchat.cache_folder import (
    DiskError,
    being_built,
    building,
    cache_dir,
    disk_error,
    disk_errors,
    is_verified,
    private_dir,
    replace_durably,
    stamp_path,
)
from specchat.errors import ModelLoadError


def test_a_second_builder_waits_for_the_first_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target, order, holding, release = tmp_path / "converted" / "model", [], threading.Event(), threading.Event()
    said = []

    def first():
        with building(target, "the model"):
            holding.set()
            release.wait(10)
            order.append("first done")

    def second():
        with building(target, "the model", lambda message, fraction: said.append(message)):
            order.append("second in")

    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(10)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.3)
    assert two.is_alive() and order == []  # blocked while the first builds
    release.set()
    one.join(), two.join(10)
    assert order == ["first done", "second in"]
    assert said == ["another specchat is building the model; waiting for it to finish"]
    assert not list(target.parent.glob("*lock*"))  # lock files live in the cache's locks/ folder


def test_a_start_can_tell_that_another_is_building_before_it_waits(tmp_path, monkeypatch):
    """What the kernel's start line reads (kernels/build.py): a second start says it waits, not that it compiles."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "kernels" / "q4-x" / "specchat_q4"
    assert not being_built(target)
    with building(target, "the kernel"):
        assert being_built(target)  # another open of the lock file: held
    assert not being_built(target)


def test_a_builder_alone_takes_the_lock_without_a_word(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    said = []
    with building(tmp_path / "gguf" / "x.gguf", "x", lambda message, fraction: said.append(message)):
        pass
    assert said == [] and (tmp_path / "cache" / "locks" / "gguf-x.gguf.lock").exists()


# ----- the cache is private: created 0700, and a root others could write to is refused -------------------
def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_and_its_folders_are_created_private(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    with building(root / "quantized" / "model.safetensors", "the model"):
        pass
    assert {
        name: _mode(path)
        for name, path in [("root", root), ("artefacts", root / "quantized"), ("locks", root / "locks")]
    } == dict.fromkeys(["root", "artefacts", "locks"], 0o700)
    assert _mode(private_dir(root / "kernels" / "q4-x")) == 0o700 and _mode(root / "kernels") == 0o700


def test_an_open_cache_root_from_before_is_closed_once_specchat_writes_in_it(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    private_dir(root / "gguf")
    assert _mode(root) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o722])
def test_a_cache_root_that_others_can_write_is_refused_in_one_line(mode, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(mode)
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    with pytest.raises(ModelLoadError, match="can be written by others") as refused:
        with building(root / "gguf" / "x.gguf", "x"):
            pytest.fail("built in a cache others can write")
    assert str(root) in str(refused.value) and "\n" not in str(refused.value)
    assert not (root / "gguf").exists() and not (root / "locks").exists()


def test_a_cache_root_of_another_user_is_refused_in_one_line(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)  # nobody's
    else:
        root = Path("/")  # root's: not this user's
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    with pytest.raises(ModelLoadError, match="not to you"):
        cache_dir()


# ----- disk faults: an optional stamp is skipped, an I/O failure is one line, a rename is durable ----------
def test_a_file_is_verified_where_the_disk_refuses_its_stamp(tmp_path, monkeypatch):
    """A read-only cache (EROFS, EACCES): the stamp is an optimisation; the file is hashed and taken."""
    path = tmp_path / "file.bin"
    path.write_bytes(b"specchat")
    digest = hashlib.sha256(b"specchat").hexdigest()

    def refused(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "write_text", refused)
    assert is_verified(path, 8, digest) and not stamp_path(path).exists()
    assert not is_verified(path, 8, "0" * 64)


def test_a_read_that_fails_for_the_disk_is_raised_not_taken_as_damage(tmp_path, monkeypatch):
    path = tmp_path / "file.bin"
    path.write_bytes(b"specchat")

    def failing(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(cache_folder, "file_sha256", failing)
    with pytest.raises(OSError) as raised:
        is_verified(path, 8, "0" * 64)
    assert raised.value.errno == errno.EIO


@pytest.mark.parametrize(
    "err, words",
    [
        (OSError(errno.ENOSPC, "No space left on device"), ["ENOSPC", "No space left", "free some space"]),
        (OSError(errno.EACCES, "Permission denied", "/c/quantized/f"), ["/c/quantized/f", "EACCES", "permissions"]),
        (OSError(errno.EROFS, "Read-only file system"), ["EROFS", "writable folder"]),
        (RuntimeError("Error while serializing: I/O error: File too large (os error 27)"), ["EFBIG", "File too large"]),
        (MemoryError(), ["ENOMEM", "out of memory"]),
    ],
)
def test_a_disk_error_is_one_line_naming_the_path_and_the_errno(err, words):
    line = disk_error(err, Path("/c/quantized/target.safetensors"), "write the cache at")
    assert "\n" not in line and line.startswith("cannot write the cache at /c/quantized/")
    assert all(word in line for word in words), line


def test_disk_errors_become_one_line_and_other_errors_pass(tmp_path):
    with pytest.raises(DiskError, match="ENOSPC"):
        with disk_errors(tmp_path, "write"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(KeyError):
        with disk_errors(tmp_path, "write"):
            raise KeyError("a bug is not a disk error")


def _fsync_log(monkeypatch) -> list[tuple[str, str]]:
    """Record fsync (of which path) and os.replace (to which path) calls, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", str(dst)))
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name an fd's file")
def test_a_replace_is_durable_its_bytes_fsynced_before_and_its_folder_after(tmp_path, monkeypatch):
    folder = tmp_path / ".conversion.tmp"
    (folder / "inner").mkdir(parents=True)
    (folder / "inner" / "weights").write_bytes(b"w")
    (folder / "config.json").write_text("{}")
    events = _fsync_log(monkeypatch)
    replace_durably(folder, tmp_path / "conversion")
    at = events.index(("replace", str(tmp_path / "conversion")))
    synced_before = {path for kind, path in events[:at] if kind == "fsync"}
    assert synced_before == {
        str(folder),
        str(folder / "inner"),
        str(folder / "inner" / "weights"),
        str(folder / "config.json"),
    }
    assert events[at + 1 :] == [("fsync", str(tmp_path))]
