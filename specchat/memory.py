"""How much memory the process holds (its resident set now, read from /proc on Linux; 0 elsewhere), and giving
the heap's freed pages back."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

STATM = Path("/proc/self/statm")


def resident_bytes(statm: Path = STATM) -> int:
    """The process's resident memory in bytes; 0 where the platform does not say."""
    try:
        pages = int(statm.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The memory the system has available (MemAvailable), or its physical memory where it does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def release_freed_memory() -> bool:
    """Hand the heap's freed pages back to the system (glibc's malloc_trim). Loading frees GBs of temporaries
    (cached blocks before they are fused): 0.2 GB of the bundled pair's resident set stayed with the heap.
    Returns False where there is no glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


class FreedPages:
    """Bytes let go a piece at a time (old storages, a fused layer's own tiles), the heap's free pages handed back
    (release_freed_memory) once `every` of them have gone: freed pages stay with the heap until trimmed, so the
    resident set would otherwise hold the old copy beside the new."""

    def __init__(self, every: int):
        self.every = every
        self.unreturned = 0

    def let_go(self, nbytes: int) -> None:
        self.unreturned += nbytes
        if self.unreturned >= self.every:
            release_freed_memory()
            self.unreturned = 0
