"""specchat's own C++ kernels, compiled once per machine into its cache (core/q4_kernel.cpp)."""
from __future__ import annotations

from functools import lru_cache

from specchat.loading.assets import cache_dir
from specchat.loading.errors import ModelLoadError, one_line
from specchat.loading.progress import Progress, report


@lru_cache(maxsize=1)
def _built_q4_kernel():
    from specchat.core.q4 import build_kernel
    return build_kernel(str(cache_dir() / "kernels" / "q4"))


def q4_kernel(progress: Progress | None = None):
    """The w4a8 kernel module; compiling it the first time takes about a minute (said on `progress`)."""
    if _built_q4_kernel.cache_info().currsize == 0:
        report(progress, "preparing the w4a8 kernel (compiled once per machine, about a minute)", None)
    try:
        return _built_q4_kernel()
    except Exception as err:  # no compiler, no AVX2: say so in one line
        raise ModelLoadError(f"quantization w4a8 is not available here: {one_line(err)}; "
                             f"use quantization = \"w8a8\" instead") from None
