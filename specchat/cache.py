"""specchat's cache folder ($SPECCHAT_CACHE, else ~/.cache/specchat) and what every artefact in it shares:
sha256 hashes, `.verified` marks that skip re-hashing an unchanged file, stale temporaries, and the build lock.

The build lock: one builder per cache artefact; a specchat that finds an artefact being built by another
waits for it. Two `python infer.py` started at once on a cold cache would otherwise both assemble, convert
and quantize the same models (twice the memory and time) and race to rename their results into place.
The lock is an advisory flock on a file in the cache's `locks/` folder, one per artefact; the kernel
releases it when its holder exits, killed or not, so a crashed builder never blocks the next start.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from specchat.progress import Progress, report

try:
    import fcntl
except ImportError:  # not POSIX (Windows): builds are not serialised there
    fcntl = None

CHUNK = 8 << 20  # bytes per read while hashing


def cache_dir() -> Path:
    """$SPECCHAT_CACHE, else the user's XDG cache directory / specchat."""
    env = os.environ.get("SPECCHAT_CACHE")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("specchat"))


def is_verified(path: Path, size: int, sha256: str, progress: Progress | None = None) -> bool:
    """True when `path` holds exactly the expected bytes; a stamp skips re-hashing an unchanged file."""
    stat = path.stat()
    if stat.st_size != size:
        return False
    stamp = stamp_path(path)
    expected = f"{sha256} {size} {stat.st_mtime_ns}"
    if stamp.exists() and stamp.read_text().strip() == expected:
        return True
    if file_sha256(path, progress) != sha256:
        return False
    stamp.write_text(expected + "\n")
    return True


def remove_stale_temporaries(target: Path) -> None:
    """Delete `.{name}.{pid}.tmp` leftovers of `target` whose writing process no longer runs."""
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        pid = leftover.name[len(target.name) + 2:-len(".tmp")]
        if pid.isdigit() and not _process_alive(int(pid)):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def mark_verified(path: Path, sha256: str) -> None:
    """Record that `path`, as it stands now, holds bytes of this sha256 (is_verified will not re-hash)."""
    stat = path.stat()
    stamp_path(path).write_text(f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n")


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    digest, done, total = hashlib.sha256(), 0, path.stat().st_size
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            report(progress, f"checking {path.name}", done / max(total, 1))
    return digest.hexdigest()


@contextmanager
def building(target: Path, what: str, progress: Progress | None = None) -> Iterator[None]:
    """Hold `target`'s build lock. When another process holds it, say so once and wait; the caller
    then checks again whether the artefact is still missing before building it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    lock = cache_dir() / "locks" / f"{target.parent.name}-{target.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report(progress, f"another specchat is building {what}; waiting for it to finish", None)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
