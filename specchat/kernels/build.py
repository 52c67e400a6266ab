"""specchat's own C++ kernels, compiled once per machine into its cache, one module: the w4a8 product
(q4_kernel.cpp and its code paths q4_path_*.cpp, beside this file), the lean forward's layer loop
(lean_layers.cpp), sampling's probabilities (sampling.cpp), and the module's Python bindings (bindings.cpp).

The module holds every code path of the product the compiler can build here (portable C++; on x86 also
AVX2, AVX-VNNI, AVX-512 VNNI and AMX-INT8) and runs the fastest one the CPU has; $SPECCHAT_KERNEL names another
(`portable`, `avx2`, `avx-vnni`, `avx512-vnni`, `amx`), for A/B runs and tests. Every path gives the same bits.

Each version of the sources builds into a folder of its own, named by the sources, the flags, torch's
version, the Python ABI and the compiler, so environments sharing a cache never load each other's build.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from specchat.cache import cache_dir
from specchat.errors import ModelLoadError, one_line
from specchat.progress import Progress, report
from specchat.spec import sampling

KERNEL_ENV = "SPECCHAT_KERNEL"  # forces a code path of the product
SOURCES = ["q4_kernel.cpp", "q4_path_portable.cpp", "q4_path_avx2.cpp", "q4_path_avx_vnni.cpp",
           "q4_path_avx512_vnni.cpp", "q4_path_amx.cpp", "lean_layers.cpp", "sampling.cpp",
           "bindings.cpp"]
HEADERS = ["q4_kernel.h", "q4_tiles.h", "q4_path_256.h", "q4_path_512.h", "simd.h"]
BASE_FLAGS = ["-O3", "-ffp-contract=off"]  # no contraction: every row, and every path, rounds alike


def _source_dir() -> Path:
    return Path(__file__).parent


def kernel_sources() -> list[Path]:
    return [_source_dir() / name for name in SOURCES]


def kernel_headers() -> list[Path]:
    return [_source_dir() / name for name in HEADERS]


def _has_avx2() -> bool:
    import torch
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _torch_uses_openmp() -> bool:
    import torch
    return "OpenMP" in torch.__config__.parallel_info() and "not found" not in torch.__config__.parallel_info()


def kernel_flags() -> list[str]:
    """The compiler flags for this machine: AVX2 (with FMA and F16C) as the layer loop's baseline where the CPU has it
    (the product's faster paths are chosen at run time either way), OpenMP where torch uses it."""
    flags = list(BASE_FLAGS)
    if _has_avx2():
        flags += ["-mavx2", "-mfma", "-mf16c"]  # F16C: every AVX2 CPU has it
    if _torch_uses_openmp():
        flags.append("-fopenmp")
    return flags


def compiler_version() -> str:
    """The first line of the C++ compiler's --version ($CXX, else c++), or why there is none."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no compiler {compiler!r}"
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{compiler}: {err}"
    return (done.stdout.splitlines() or [""])[0]


def build_identity() -> bytes:
    import torch
    sources = b"".join(path.read_bytes() for path in [*kernel_sources(), *kernel_headers()])
    context = [" ".join(kernel_flags()), torch.__version__, sys.implementation.cache_tag, compiler_version()]
    return sources + "\n".join(context).encode()


def q4_build_dir() -> Path:
    """The kernel module's build folder for this version of its sources, flags and toolchain."""
    return cache_dir() / "kernels" / f"q4-{hashlib.sha256(build_identity()).hexdigest()[:16]}"


def build_kernel(build_dir: str, name: str = "specchat_q4"):
    """The compiled kernel module, built once into build_dir with the machine's C++ compiler; later
    calls load it. Raises where nothing compiles (the compiler's log is in build_dir)."""
    import importlib.util

    from torch.utils.cpp_extension import load
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (install one, or set $CXX)")
    if importlib.util.find_spec("ninja"):  # the ninja package's binary, for a venv that is not on PATH
        import ninja
        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    Path(build_dir).mkdir(parents=True, exist_ok=True)
    flags = kernel_flags()
    return load(name, [str(path) for path in kernel_sources()], extra_cflags=flags,
                extra_ldflags=[flag for flag in flags if flag == "-fopenmp"], build_directory=build_dir)


@lru_cache(maxsize=1)
def _kernel_or_error() -> tuple[object | None, str]:
    """(the built module, "") or (None, why not), once a process: a failed build is not retried."""
    build_dir = q4_build_dir()
    try:
        module = build_kernel(str(build_dir))
    except Exception as err:  # no compiler, no OpenMP, a compile error: the whole log in build.log
        build_dir.mkdir(parents=True, exist_ok=True)
        log = build_dir / "build.log"
        log.write_text(f"{type(err).__name__}: {err}\n")
        return None, f"{one_line(err)} (build log: {log})"
    sampling.use_native_probs(module.top_p_probs)  # sampled rows on the CPU take its one-pass probabilities
    forced = os.environ.get(KERNEL_ENV, "")
    try:
        if forced:
            module.set_kernel_path(forced)
    except RuntimeError as err:
        return None, f"${KERNEL_ENV} = {forced}: {one_line(err)}"
    return module, ""


def kernel_problem(path: str = "auto", progress: Progress | None = None) -> str:
    """'' when the w4a8 kernel is built here (compiling it the first time, about a minute) and runs
    on `path` (runtime.kernel; auto: as it is, $SPECCHAT_KERNEL or else the fastest this CPU has);
    else why not."""
    built = (q4_build_dir() / "specchat_q4.so").exists()
    if _kernel_or_error.cache_info().currsize == 0 and not built and shutil.which(os.environ.get("CXX", "c++")):
        report(progress, "compiling the w4a8 kernel (once per machine, about a minute)", None)
    module, problem = _kernel_or_error()
    if module is None or path == "auto":
        return problem
    try:
        module.set_kernel_path(path)
    except RuntimeError as err:
        return f"runtime.kernel = {path}: {one_line(err)}"
    return ""


def q4_kernel(progress: Progress | None = None):
    """The w4a8 kernel module; raises ModelLoadError in one line where it cannot be had."""
    problem = kernel_problem("auto", progress)
    if problem:
        raise ModelLoadError(f"quantization w4a8 is not available here: {problem}")
    return _kernel_or_error()[0]


def running_path() -> str:
    """The code path the kernel's products run on, or '' when no model uses the kernel (nothing built)."""
    if _kernel_or_error.cache_info().currsize == 0:
        return ""
    module = _kernel_or_error()[0]
    return module.kernel_path() if module is not None else ""
