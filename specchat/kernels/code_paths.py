"""Which of the w4a8 product's code paths a kernel build compiles.

A first start compiles only the path this CPU runs (the fastest it has, read from /proc/cpuinfo's flags as
cpu_features.cpp asks CPUID at run time), with the portable path every build holds (the reference the others
match, and the fallback). The paths a CPU would never pick are compiled only when one is asked for by name
($SPECCHAT_KERNEL, runtime.kernel): a build of every path then, in a folder of its own. On a Zen 4 with 2 cores
the AVX2 and AVX-VNNI paths were 11 of a clean build's 60 compile-seconds; on an AVX2-only CPU the AVX-512 path
alone is 13.

Where the flags cannot be read (no /proc/cpuinfo) an x86 build compiles every path and lets the CPU choose.
"""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
PATHS = ("amx", "avx512-vnni", "avx-vnni", "avx2", "portable")  # fastest first, as q4_kernel.cpp's table
X86_PATHS = PATHS[:-1]
_VECTOR = frozenset({"avx2", "fma", "f16c"})
_AVX512 = _VECTOR | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
NEEDS = {  # the /proc/cpuinfo flags a path needs (cpu_features.cpp asks CPUID for the same)
    "amx": _AVX512 | {"amx_tile", "amx_int8"},
    "avx512-vnni": _AVX512,
    "avx-vnni": _VECTOR | {"avx_vnni"},
    "avx2": _VECTOR,
}
ALSO = {
    "amx": ("avx512-vnni",)
}  # amx runs fewer than 32 rows on the AVX-512 path, and it where the OS holds the tiles back
SOURCES = {  # each path's own source file, below kernels/
    "amx": "q4/q4_path_amx.cpp",
    "avx512-vnni": "q4/q4_path_avx512_vnni.cpp",
    "avx-vnni": "q4/q4_path_avx_vnni.cpp",
    "avx2": "q4/q4_path_avx2.cpp",
    "portable": "q4/q4_path_portable.cpp",
}


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The CPU's feature flags as /proc/cpuinfo lists them, or None where it cannot be read."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        return None
    return None


def fastest_paths(flags: frozenset[str] | None) -> tuple[str, ...]:
    """The paths a build compiles for a CPU with these flags: its fastest (with the one that runs beside it), and
    portable; every path where the flags are unknown."""
    if not is_x86():
        return ("portable",)
    if flags is None:
        return PATHS
    best = next((path for path in X86_PATHS if NEEDS[path] <= flags), "portable")
    return tuple(path for path in PATHS if path in (best, *ALSO.get(best, ()), "portable"))


def every_path() -> tuple[str, ...]:
    """The paths a build compiles when one outside the fastest is asked for: all the compiler can build here."""
    return PATHS if is_x86() else ("portable",)


def paths_for(asked: str, flags: frozenset[str] | None) -> tuple[str, ...]:
    """The paths to compile so that `asked` (a path's name, or auto) can run: every path where the fastest build lacks
    one the CPU has; else the fastest build (where `asked` names no path, or one the CPU lacks, the module says so
    when it is set)."""
    fastest = fastest_paths(flags)
    runs_here = asked in PATHS and (flags is None or NEEDS.get(asked, frozenset()) <= flags)
    return every_path() if runs_here and asked not in fastest else fastest


def path_macros(paths: tuple[str, ...]) -> list[str]:
    """The compiler's -D flags that put these paths in q4_kernel.cpp's table."""
    return [f"-DSPECCHAT_PATH_{path.upper().replace('-', '_')}" for path in paths]
