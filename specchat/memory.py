"""How much memory the process holds: its resident set now, read from /proc on Linux (0 elsewhere)."""
from __future__ import annotations

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
