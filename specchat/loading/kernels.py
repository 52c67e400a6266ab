"""specchat's own C++ kernels, compiled once per machine into its cache (core/q4_kernel.cpp)."""
from __future__ import annotations

from functools import lru_cache

from specchat.loading.assets import cache_dir
from specchat.loading.errors import ModelLoadError, one_line
from specchat.loading.progress import Progress, report


def _looks_built() -> bool:
    """Whether a build of the kernel newer than its source is in the cache (torch decides for sure)."""
    from pathlib import Path

    import specchat.core.q4 as q4
    built = cache_dir() / "kernels" / "q4" / "specchat_q4.so"
    source = Path(q4.__file__).with_name("q4_kernel.cpp")
    return built.exists() and built.stat().st_mtime >= source.stat().st_mtime


@lru_cache(maxsize=1)
def _built_q4_kernel():
    from specchat.core.q4 import build_kernel
    return build_kernel(str(cache_dir() / "kernels" / "q4"))


def q4_kernel(progress: Progress | None = None):
    """The w4a8 kernel module; compiling it the first time takes about a minute (said on `progress`)."""
    if _built_q4_kernel.cache_info().currsize == 0 and not _looks_built():
        report(progress, "compiling the w4a8 kernel (once per machine, about a minute)", None)
    try:
        return _built_q4_kernel()
    except Exception as err:  # no compiler, no AVX2: say so in one line
        raise ModelLoadError(f"quantization w4a8 is not available here: {one_line(err)}; "
                             f"use quantization = \"w8a8\" instead") from None
