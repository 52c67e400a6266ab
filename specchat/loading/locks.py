"""One builder per cache artefact: a specchat that finds an artefact being built by another waits for it.

Two `python infer.py` started at once on a cold cache would otherwise both assemble, convert and
quantize the same models (twice the memory and time) and race to rename their results into place.
The lock is an advisory flock on a file in the cache's `locks/` folder, one per artefact; the kernel
releases it when its holder exits, killed or not, so a crashed builder never blocks the next start.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specchat.loading.assets import cache_dir
from specchat.loading.progress import Progress, report

try:
    import fcntl
except ImportError:  # not POSIX (Windows): builds are not serialised there
    fcntl = None


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
