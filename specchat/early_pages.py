"""The tiles' fresh memory faulted in while the program is still importing.

A start reads or tiles each model's w4a8 weights into one region of 2 MB pages (loading/tile_arena.py): 4.25 GiB
for a 7B Q4_K_M target. Faulting those pages in took 2.4–5.7 s of such a target's warm start on an Intel Xeon VM (it
hands freed memory back to its host, so every new process faults it in afresh; the same size taken again within one
process: 0.4–0.9 s), after 3–4 s in which one core imported torch and transformers and the other waited.

So each start remembers, for its command line, the sizes of the regions it took, in the cache (`regions.json`); a
later start with the same command line maps regions of those sizes and faults them in on a thread of its own from
its first line (libc's memset, which runs without the GIL) while the main thread imports. A placement takes one of
exactly the size it needs (`take`); one left untaken is unmapped once the models are loaded (`finish`). A size that
differs costs a region faulted in vain, never a wrong one; what is resident of it meanwhile counts as room in the
memory check (loading/memory_need.py). Nothing here imports torch: entry.py starts it before anything else.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import mmap
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from specchat.cache_folder import cache_dir
from specchat.fileio import write_text_atomic
from specchat.memory import available_memory

HUGE_PAGE = 2 << 20
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HINTS = "regions.json"  # in the cache: {command line's key: [bytes of each region its last start took]}
KEPT = 16  # command lines remembered, the latest
MOST_REGIONS = 8  # a start's regions remembered (a pair: 2)
CHUNK = 64 << 20  # bytes faulted in a call, between which the bytes held so far are counted (held())


def huge_pages_offered(setting: Path = THP_SETTING) -> bool:
    """Whether this system gives a region that asks for them transparent huge pages (Linux, not "[never]")."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        text = setting.read_text()
    except OSError:
        return False
    return "[" in text and "[never]" not in text


def anonymous_region(nbytes: int, setting: Path = THP_SETTING) -> mmap.mmap | None:
    """A private anonymous mapping of `nbytes` and one 2 MB page more (room for a 2 MB-aligned first byte) that asks
    for 2 MB pages; None where they are not offered, there is no room, or the kernel refuses the advice."""
    if not huge_pages_offered(setting):
        return None
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
    except OSError:
        return None
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        region.close()
        return None
    return region


def fault_in(region: mmap.mmap, done: Callable[[int], None] = lambda nbytes: None) -> None:
    """Every page of the mapping resident now, zeros, written by libc's memset (outside the GIL) CHUNK bytes at a
    time, each chunk's bytes told to `done` once they are resident."""
    first = ctypes.c_char.from_buffer(region)
    try:
        for offset in range(0, len(region), CHUNK):
            nbytes = min(CHUNK, len(region) - offset)
            ctypes.memset(ctypes.addressof(first) + offset, 0, nbytes)
            done(nbytes)
    finally:
        del first  # the mapping can be closed again


def command_key(argv: list[str], cwd: str) -> str:
    """What names a command line among the remembered ones."""
    return hashlib.sha256(json.dumps([argv, cwd]).encode()).hexdigest()[:32]


def read_hints(path: Path) -> dict[str, list[int]]:
    """The remembered sizes; {} where the file is missing, unreadable or not of the expected form."""
    try:
        hints = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(hints, dict):
        return {}
    return {key: sizes for key, sizes in hints.items() if _sizes_ok(sizes)}


def _sizes_ok(sizes: object) -> bool:
    return (
        isinstance(sizes, list)
        and len(sizes) <= MOST_REGIONS
        and all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes)
    )


def write_hints(path: Path, hints: dict[str, list[int]]) -> bool:
    """The latest KEPT command lines' sizes, written whole (a start reading it meanwhile sees the old or the new);
    False where the cache took no file (read-only, full): the next start then faults its pages in the ordinary way."""
    try:
        write_text_atomic(path, json.dumps(dict(list(hints.items())[-KEPT:])))
    except OSError:
        return False
    return True


class EarlyRegions:
    """One start's regions: those faulted in ahead (for the sizes its command line took last time) and the sizes
    taken, to be remembered for the next start."""

    def __init__(self, hints: Path, key: str):
        self.hints, self.key = hints, key
        self.waiting: list[int] = []  # sizes asked for ahead and not yet taken: a take of one waits for the thread
        self.ready: list[mmap.mmap] = []  # faulted in whole, not yet taken
        self.in_flight = 0  # bytes of the region being faulted in that are resident already
        self.taken: list[int] = []
        self.thread: threading.Thread | None = None

    def start(self, sizes: list[int]) -> None:
        """Fault regions of `sizes` in on a thread of their own (where 2 MB pages are offered)."""
        self.waiting = list(sizes)
        self.thread = threading.Thread(target=self._fault, args=(sizes,), name="specchat-early-pages", daemon=True)
        self.thread.start()

    def _fault(self, sizes: list[int]) -> None:
        for size in sizes:
            region = anonymous_region(size)
            if region is None:
                return
            fault_in(region, functools.partial(self._resident, size))
            self.in_flight = 0  # before the region counts among the ready: held() may read low a moment, never high
            self.ready.append(region)

    def _resident(self, size: int, nbytes: int) -> None:
        """`nbytes` more of the region being faulted in are resident (at most its `size`: the alignment page aside)."""
        self.in_flight = min(size, self.in_flight + nbytes)

    def wait(self) -> None:
        """Until every region is faulted in (or the thread gave up)."""
        if self.thread is not None:
            self.thread.join()

    def take(self, nbytes: int) -> mmap.mmap | None:
        """A region faulted in ahead for exactly `nbytes` (anonymous_region's layout), once; None where none was."""
        self.taken.append(nbytes)
        if nbytes not in self.waiting:
            return None
        self.waiting.remove(nbytes)
        self.wait()
        for region in self.ready:
            if len(region) == nbytes + HUGE_PAGE:
                self.ready.remove(region)
                return region
        return None

    def held(self) -> int:
        """Bytes of the regions faulted in ahead that are resident now and not taken yet (a region's pages still to
        fault are still in the system's available memory: counting them here too would count them twice)."""
        return sum(len(region) - HUGE_PAGE for region in list(self.ready)) + self.in_flight

    def finish(self) -> None:
        """Unmap what was not taken, and remember the sizes taken for the next start of this command line."""
        self.wait()
        for region in self.ready:
            region.close()
        self.ready, self.waiting = [], []
        if self.taken:
            hints = read_hints(self.hints)
            hints.pop(self.key, None)  # to the end: the latest
            write_hints(self.hints, {**hints, self.key: self.taken[:MOST_REGIONS]})


_START: EarlyRegions | None = None  # this process's, from start() to finish()


def start(argv: list[str], cwd: str | None = None) -> None:
    """Fault in, on a thread, the regions the last start of this command line took, where they still fit in the
    memory available; and remember this start's."""
    global _START
    try:
        hints = cache_dir() / HINTS
    except Exception:  # a cache the load will refuse in its own words
        return
    key = command_key(argv, os.getcwd() if cwd is None else cwd)
    _START = EarlyRegions(hints, key)
    sizes = read_hints(hints).get(key, [])
    if sizes and huge_pages_offered() and sum(sizes) < available_memory() // 2:
        _START.start(sizes)


def take(nbytes: int) -> mmap.mmap | None:
    return _START.take(nbytes) if _START is not None else None


def held_bytes() -> int:
    return _START.held() if _START is not None else 0


def finish() -> None:
    global _START
    if _START is not None:
        _START.finish()
        _START = None
