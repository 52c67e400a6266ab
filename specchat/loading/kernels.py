"""specchat's own C++ kernels, compiled once per machine into its cache (core/q4_kernel.cpp and
core/lean_layers.cpp, one module).

Each version of the source builds into a folder of its own (named by the source's and the flags'
sha256), so two specchat versions sharing a cache never rebuild over each other's build.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from specchat.loading.assets import cache_dir
from specchat.loading.errors import ModelLoadError, one_line
from specchat.loading.progress import Progress, report


def q4_build_dir() -> Path:
    """The w4a8 kernel's build folder for this version of its source and flags."""
    import specchat.core.q4 as q4
    sources = b"".join(path.read_bytes() for path in [*q4.kernel_sources(), *q4.kernel_headers()])
    digest = hashlib.sha256(sources + " ".join(q4.KERNEL_FLAGS).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"q4-{digest}"


@lru_cache(maxsize=1)
def _built_q4_kernel():
    from specchat.core.q4 import build_kernel
    return build_kernel(str(q4_build_dir()))


def q4_kernel(progress: Progress | None = None):
    """The w4a8 kernel module; compiling it the first time takes about a minute (said on `progress`)."""
    if _built_q4_kernel.cache_info().currsize == 0 and not (q4_build_dir() / "specchat_q4.so").exists():
        report(progress, "compiling the w4a8 kernel (once per machine, about a minute)", None)
    try:
        return _built_q4_kernel()
    except Exception as err:  # no compiler, no AVX2: say so in one line
        raise ModelLoadError(f"quantization w4a8 is not available here: {one_line(err)}; "
                             f"use quantization = \"w8a8\" instead") from None
