"""specchat's own C++ kernels, compiled once per machine into its cache, one module: the w4a8 product
(q4/: q4_kernel.cpp, its code paths q4_path_*.cpp, and cpu_features.cpp, which says which the CPU runs), the lean forward's layer loop
(lean_layers.cpp), sampling's probabilities (sampling.cpp), and the module's Python bindings (bindings.cpp).

The product has code paths (portable C++; on x86 also AVX2, AVX-VNNI, AVX-512 VNNI and AMX-INT8) that give the
same bits. A build holds the fastest this CPU has and the portable one (code_paths.py); a path named by
$SPECCHAT_KERNEL or runtime.kernel (`portable`, `avx2`, `avx-vnni`, `avx512-vnni`, `amx`) that such a build lacks,
or $SPECCHAT_KERNEL_BUILD=every (for A/B runs and tests), takes a build of every path the compiler can build here.

Each version of the sources builds into a folder of its own, named by the sources, the paths, the flags, torch's
version, the Python ABI and the compiler, so environments sharing a cache never load each other's build.

A build never waits on a dead builder. torch's load() takes an O_EXCL `lock` file in the build folder on
every call, and a start killed while holding it (SIGKILL, the OOM killer, a power cut) leaves the file, on
which every later start would wait for ever. So specchat holds its own build lock (cache_folder.building, an flock
the kernel drops when its holder dies) around load(), and under it deletes a `lock` file it finds: no other
specchat builds in this folder then. A finished build gets a stamp (BUILT) that later starts import
directly, without load(), ninja or the lock: a read-only cache starts too.

The folder's name is predictable, and torch loads whatever `.so` it finds there up to date: only the cache's
owner may write below its root (cache_folder.cache_dir refuses a root others own or can write), so no other user can
plant a module for a start to load.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from specchat.cache_folder import being_built, building, cache_dir, fsync_one, optional_write, private_dir
from specchat.errors import ModelLoadError, one_line
from specchat.kernels import code_paths
from specchat.progress import Progress, report

KERNEL_ENV = "SPECCHAT_KERNEL"  # forces a code path of the product
BUILD_ENV = "SPECCHAT_KERNEL_BUILD"  # `every`: a build of every path, whatever the CPU runs fastest
BUILDS = ("fastest", "every")  # $SPECCHAT_KERNEL_BUILD's values; fastest (the default): code_paths' choice
# The sources, the slowest to compile first (ninja starts them in this order: the build ends sooner than when a long
# one starts last), each compiled path's own file (code_paths.SOURCES, the AVX-512 ones among the slowest) in place.
SOURCES = [
    PATHS_HERE := "the compiled paths' files",
    "bindings.cpp",
    "tensor_sources.cpp",  # lean_layers.cpp, q4/q4_kernel.cpp and sampling.cpp as one unit (ATen's headers once)
    "q4/quantize_avx2.cpp",
    "q4/file_tiles.cpp",
    "q4/cpu_features.cpp",
]
INCLUDED = [  # the files the sources include (tensor_sources.cpp: three sources): all in the build's identity
    "lean_layers.cpp",
    "q4/q4_kernel.cpp",
    "sampling.cpp",
    "lean_layers.h",
    "q4/q4_kernel.h",
    "q4/cpu_features.h",
    "q4/q4_tiles.h",
    "q4/file_tiles.h",
    "q4/q4_path_256.h",
    "q4/q4_path_512.h",
    "q4/tile_shares.h",
    "simd.h",
]
BASE_FLAGS = ["-O3", "-ffp-contract=off"]  # no contraction: every row, and every path, rounds alike
LAYOUT = "flock+stamp"  # how a build folder is used, in its name: builds that took no flock share no folder
BUILT = "built.txt"  # in a build folder: the module's name, size and mtime once load() built it


def _source_dir() -> Path:
    return Path(__file__).parent


def kernel_sources(paths: tuple[str, ...] = code_paths.PATHS) -> list[Path]:
    """The module's sources with those of these code paths."""
    names = [[code_paths.SOURCES[path] for path in paths] if name == PATHS_HERE else [name] for name in SOURCES]
    return [_source_dir() / name for group in names for name in group]


def kernel_includes() -> list[Path]:
    return [_source_dir() / name for name in INCLUDED]


def _has_avx2() -> bool:
    import torch

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _torch_uses_openmp() -> bool:
    import torch

    return "OpenMP" in torch.__config__.parallel_info() and "not found" not in torch.__config__.parallel_info()


def kernel_flags(paths: tuple[str, ...] = code_paths.PATHS) -> list[str]:
    """The compiler flags for this machine and these code paths: AVX2 (with FMA and F16C) as the layer loop's baseline
    where the CPU has it (the product's path is chosen at run time either way), OpenMP where torch uses it."""
    flags = [*BASE_FLAGS, *code_paths.path_macros(paths)]
    if _has_avx2():
        flags += ["-mavx2", "-mfma", "-mf16c"]  # F16C: every AVX2 CPU has it
    if _torch_uses_openmp():
        flags.append("-fopenmp")
    return flags


def compiler_version() -> str:
    """The first line of the C++ compiler's --version ($CXX, else c++), or why there is none."""
    return _compiler_line(os.environ.get("CXX", "c++"))


@cache
def _compiler_line(compiler: str) -> str:
    """compiler_version's line, asked once a process (a subprocess: 0.3 s of a warm start)."""
    if shutil.which(compiler) is None:
        return f"no compiler {compiler!r}"
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{compiler}: {err}"
    return (done.stdout.splitlines() or [""])[0]


def build_identity(paths: tuple[str, ...]) -> bytes:
    import torch

    sources = b"".join(path.read_bytes() for path in [*kernel_sources(paths), *kernel_includes()])
    context = [
        " ".join(kernel_flags(paths)),
        torch.__version__,
        sys.implementation.cache_tag,
        compiler_version(),
        LAYOUT,
    ]
    return sources + "\n".join(context).encode()


def q4_build_dir(paths: tuple[str, ...] | None = None) -> Path:
    """The kernel module's build folder for this version of its sources, code paths (by default the build this process
    runs, else the one it would build first), flags and toolchain."""
    paths = paths or _paths_for("auto")
    tag = "every" if paths == code_paths.every_path() else "-".join(paths)
    return cache_dir() / "kernels" / f"q4-{tag}-{hashlib.sha256(build_identity(paths)).hexdigest()[:16]}"


def build_kernel(build_dir: str, name: str = "specchat_q4", paths: tuple[str, ...] = code_paths.PATHS):
    """The compiled kernel module with these code paths, built once into build_dir with the machine's C++ compiler;
    later calls load it. Raises where nothing compiles (the compiler's log is in build_dir)."""
    import importlib.util

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (install one, or set $CXX)")
    if importlib.util.find_spec("ninja"):  # the ninja package's binary, for a venv that is not on PATH
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    flags = kernel_flags(paths)
    openmp = [flag for flag in flags if flag == "-fopenmp"]
    return load_extension(name, kernel_sources(paths), Path(build_dir), flags, openmp)


def load_extension(name: str, sources: list[Path], build_dir: Path, cflags: list[str], ldflags: list[str]):
    """torch's load() of a C++ extension, made safe against killed builders (see the module's note): a
    module stamped as built is imported directly; else load() runs under specchat's build lock, with a
    stale torch `lock` file cleared first."""
    built = _built_module(build_dir, name)
    if built is not None:
        return _import(name, built)
    from torch.utils.cpp_extension import load

    with building(build_dir / name, f"the {name} kernel"):
        built = _built_module(build_dir, name)  # built by another start while this one waited
        if built is not None:
            return _import(name, built)
        (build_dir / "lock").unlink(missing_ok=True)  # a dead builder's: no live one runs here, we hold the flock
        with leashed_ninja(build_dir):
            module = load(
                name,
                [str(path) for path in sources],
                extra_cflags=cflags,
                extra_ldflags=ldflags,
                build_directory=str(build_dir),
            )
        _stamp_built(build_dir, Path(module.__file__))
    return module


@contextmanager
def leashed_ninja(build_dir: Path) -> Iterator[None]:
    """Inside: the `ninja` on PATH is a shim (ninja_leash.py) that dies with this process, its compile jobs with it.
    Where no ninja is found, or the shim cannot be written, PATH is left as it is."""
    real = shutil.which("ninja")
    shim = build_dir / "leash" / "ninja"
    if real is None or not optional_write(lambda: _write_shim(shim, Path(real))):
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{shim.parent}{os.pathsep}{before}"
    try:
        yield
    finally:
        os.environ["PATH"] = before


def _write_shim(shim: Path, real: Path) -> None:
    private_dir(shim.parent)
    leash = Path(__file__).with_name("ninja_leash.py")
    quoted = " ".join(shlex.quote(str(part)) for part in (sys.executable, leash))
    shim.write_text(f'#!/bin/sh\nexec {quoted} "$PPID" {shlex.quote(str(real))} "$@"\n')
    shim.chmod(0o700)


def _built_module(build_dir: Path, name: str) -> Path | None:
    """The module file a stamp says was built here, when it is still that file (same size and mtime)."""
    try:
        recorded = (build_dir / BUILT).read_text().split()
        library = build_dir / recorded[0]
        info = library.stat()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    matches = len(recorded) == 3 and recorded[1:] == [str(info.st_size), str(info.st_mtime_ns)]
    return library if matches and library.stem == name else None


def _stamp_built(build_dir: Path, library: Path) -> None:
    """Stamp a finished build, its module fsynced first (a stamp never outlives its module's bytes);
    where the folder is read-only or full, later starts go through load() again."""

    def stamp():
        fsync_one(library)
        info = library.stat()
        (build_dir / BUILT).write_text(f"{library.name} {info.st_size} {info.st_mtime_ns}\n")

    optional_write(stamp)


def _import(name: str, library: Path):
    """Import a built extension module from its file, as torch's load() does once it is built."""
    import importlib.util

    import torch  # noqa: F401  the module links against torch's libraries, loaded by importing torch

    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_running: list[tuple[str, ...]] = []  # the code paths of the build this process runs, once one is loaded


def _paths_for(asked: str) -> tuple[str, ...]:
    """The code paths of the build that runs `asked` (a path's name, or auto: $SPECCHAT_KERNEL's, else the fastest):
    the build this process runs where it holds it, else code_paths' choice ($SPECCHAT_KERNEL_BUILD=every: all)."""
    asked = asked if asked != "auto" else os.environ.get(KERNEL_ENV, "")
    if _running and (not asked or asked in _running[-1]):
        return _running[-1]
    if os.environ.get(BUILD_ENV, "") == "every":
        return code_paths.every_path()
    return code_paths.paths_for(asked, code_paths.cpu_flags())


@cache
def _kernel_or_error(paths: tuple[str, ...]) -> tuple[object | None, str]:
    """(the built module with these code paths, "") or (None, why not), once a process: a failed build is not
    retried."""
    build_dir = q4_build_dir(paths)
    try:
        module = build_kernel(str(build_dir), paths=paths)
    except Exception as err:  # no compiler, no OpenMP, a compile error, a full disk: the whole log in build.log
        log = build_dir / "build.log"
        if not optional_write(lambda error=err: _write_log(log, error)):
            return None, one_line(err)  # a full or read-only cache: no log to point at
        return None, f"{one_line(err)} (build log: {log})"
    forced = os.environ.get(KERNEL_ENV, "")
    try:
        if forced:
            module.set_kernel_path(forced)
    except RuntimeError as err:
        return None, f"${KERNEL_ENV} = {forced}: {one_line(err)}"
    return module, ""


def _write_log(log: Path, err: Exception) -> None:
    private_dir(log.parent)
    log.write_text(f"{type(err).__name__}: {err}\n")


def kernel_problem(path: str = "auto", progress: Progress | None = None, holding: str = "auto") -> str:
    """'' when the w4a8 kernel is built here (compiling it the first time, under a minute) and runs
    on `path` (runtime.kernel; auto: as it is, $SPECCHAT_KERNEL or else the fastest this CPU has);
    else why not. A path the running build lacks (`path`, or `holding` where path is auto: one to be set later) loads
    (or builds) one that holds it, for the whole process."""
    if (os.environ.get(BUILD_ENV) or "fastest") not in BUILDS:
        return f"${BUILD_ENV} = {os.environ[BUILD_ENV]}: use one of {', '.join(BUILDS)}"
    paths = _paths_for(path if path != "auto" else holding)
    if _kernel_or_error.cache_info().currsize == 0 or paths not in _running:
        _announce_build(paths, progress)
    module, problem = _kernel_or_error(paths)
    if module is None:
        return problem
    _running[:] = [paths]
    if path == "auto":
        return ""
    try:
        module.set_kernel_path(path)
    except RuntimeError as err:
        return f"runtime.kernel = {path}: {one_line(err)}"
    return ""


def _announce_build(paths: tuple[str, ...], progress: Progress | None) -> None:
    """Say so where the build with these paths is still to be compiled (by this start or another)."""
    build_dir = q4_build_dir(paths)
    if (build_dir / "specchat_q4.so").exists() or not shutil.which(os.environ.get("CXX", "c++")):
        return
    if being_built(build_dir / "specchat_q4"):
        report(progress, "another specchat is compiling the w4a8 kernel; waiting for it (under a minute)", None)
    else:
        report(progress, f"compiling the w4a8 kernel for {_named(paths)} (once per machine, under a minute)", None)


def _named(paths: tuple[str, ...]) -> str:
    return "every code path" if paths == code_paths.every_path() else " and ".join(paths)


def q4_kernel(progress: Progress | None = None):
    """The w4a8 kernel module this process runs; raises ModelLoadError in one line where it cannot be had."""
    problem = kernel_problem("auto", progress)
    if problem:
        raise ModelLoadError(f"quantization w4a8 is not available here: {problem}")
    return _kernel_or_error(_running[-1])[0]


def running_path() -> str:
    """The code path the kernel's products run on, or '' when no model uses the kernel (nothing built)."""
    if not _running:
        return ""
    module = _kernel_or_error(_running[-1])[0]
    return module.kernel_path() if module is not None else ""
