"""A kernel build compiles the code path this CPU runs (and portable), every path only when one outside it is asked
for (kernels/code_paths.py, kernels/build.py): which paths, for which CPU, in which folder, and the build a user's
start makes, compiled here, holding just those paths with the every-path build's bits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specchat.kernels import build, code_paths
from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import run_kernel

BASE = {"sse4_2", "avx", "avx2", "fma", "f16c"}
ZEN4 = frozenset(BASE | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"})
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_int8", "amx_bf16", "avx_vnni"}
ALDER_LAKE = frozenset(BASE | {"avx_vnni"})
HASWELL = frozenset(BASE)
OLD = frozenset({"sse4_2", "avx"})


@pytest.fixture
def x86(monkeypatch):
    monkeypatch.setattr(code_paths, "is_x86", lambda: True)


@pytest.mark.parametrize(
    "flags, paths",
    [
        (SAPPHIRE_RAPIDS, ("amx", "avx512-vnni", "portable")),  # amx runs its few rows on the AVX-512 path
        (ZEN4, ("avx512-vnni", "portable")),
        (ALDER_LAKE, ("avx-vnni", "portable")),
        (HASWELL, ("avx2", "portable")),
        (OLD, ("portable",)),
        (None, code_paths.PATHS),  # flags unknown: every path, the CPU chooses
    ],
)
def test_a_build_holds_the_fastest_path_the_cpus_flags_allow_and_portable(x86, flags, paths):
    assert code_paths.fastest_paths(flags) == paths
    assert code_paths.paths_for("auto", flags) == paths


def test_a_named_path_the_fastest_build_lacks_takes_every_path_unless_the_cpu_lacks_it_too(x86):
    assert code_paths.paths_for("avx2", ZEN4) == code_paths.PATHS
    assert code_paths.paths_for("portable", ZEN4) == ("avx512-vnni", "portable")
    assert code_paths.paths_for("avx512-vnni", SAPPHIRE_RAPIDS) == ("amx", "avx512-vnni", "portable")
    assert code_paths.paths_for("amx", ZEN4) == ("avx512-vnni", "portable")  # the module says the CPU lacks it
    assert code_paths.paths_for("sse9", ZEN4) == ("avx512-vnni", "portable")  # and that it knows no such path


def test_off_x86_only_the_portable_path_is_built(monkeypatch):
    monkeypatch.setattr(code_paths, "is_x86", lambda: False)
    assert code_paths.fastest_paths(ZEN4) == code_paths.every_path() == ("portable",)


def test_cpu_flags_are_read_from_cpuinfo_and_none_where_it_cannot_be_read(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: test\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: other\n")
    assert code_paths.cpu_flags(info) == {"fpu", "avx2", "fma"}
    assert code_paths.cpu_flags(tmp_path / "missing") is None


def test_each_set_of_paths_builds_from_its_own_sources_with_its_own_macros_in_a_folder_of_its_own(x86):
    zen4 = ("avx512-vnni", "portable")
    names = [path.name for path in build.kernel_sources(zen4)]
    assert "q4_path_avx512_vnni.cpp" in names and "q4_path_portable.cpp" in names
    assert not {"q4_path_avx2.cpp", "q4_path_avx_vnni.cpp", "q4_path_amx.cpp"} & set(names)
    assert {"quantize_avx2.cpp", "tensor_sources.cpp", "bindings.cpp"} <= set(names)
    included = {path.name for path in build.kernel_includes()}
    assert {"q4_kernel.cpp", "lean_layers.cpp", "sampling.cpp", "q4_kernel.h"} <= included  # in the identity
    flags = build.kernel_flags(zen4)
    assert "-DSPECCHAT_PATH_AVX512_VNNI" in flags and "-DSPECCHAT_PATH_PORTABLE" in flags
    assert "-DSPECCHAT_PATH_AVX2" not in flags
    assert build.q4_build_dir(zen4).name.startswith("q4-avx512-vnni-portable-")
    assert build.q4_build_dir(code_paths.PATHS).name.startswith("q4-every-")


def test_the_build_env_chooses_every_path_or_the_fastest_and_refuses_other_values(x86, monkeypatch):
    monkeypatch.setattr(build, "_running", [])
    monkeypatch.setattr(code_paths, "cpu_flags", lambda cpuinfo=None: ZEN4)
    monkeypatch.delenv(build.KERNEL_ENV, raising=False)
    monkeypatch.setenv(build.BUILD_ENV, "fastest")
    assert build._paths_for("auto") == ("avx512-vnni", "portable")
    assert build._paths_for("avx2") == code_paths.PATHS
    monkeypatch.setenv(build.KERNEL_ENV, "avx2")
    assert build._paths_for("auto") == code_paths.PATHS
    monkeypatch.delenv(build.KERNEL_ENV)
    monkeypatch.setenv(build.BUILD_ENV, "every")
    assert build._paths_for("auto") == code_paths.PATHS
    monkeypatch.setenv(build.BUILD_ENV, "all")
    assert build.kernel_problem() == "$SPECCHAT_KERNEL_BUILD = all: use one of fastest, every"


def test_the_build_a_start_makes_holds_this_cpus_fastest_path_with_the_every_path_builds_bits(kernel, tmp_path):
    """Compiled here, into a folder of its own (the user's build, while the tests run the every-path one)."""
    paths = code_paths.fastest_paths(code_paths.cpu_flags())
    fastest = build.build_kernel(str(tmp_path / "fastest"), name="specchat_q4_fastest", paths=paths)
    running = [path for path in kernel.kernel_paths() if path in paths]
    assert fastest.kernel_paths() == running and fastest.kernel_path() == running[0]
    for name in kernel.kernel_paths():
        if name not in paths:
            with pytest.raises(RuntimeError, match=f"kernel path {name} is not in this build .* builds one with every"):
                fastest.set_kernel_path(name)
    torch.manual_seed(3)
    tiles = Q4Tiles.from_block(Q4Block.quantize(torch.randn(48, 512) * 0.1, 4))
    x = torch.randn(9, 512)
    before = kernel.kernel_path()
    try:
        for name in running:
            fastest.set_kernel_path(name)
            kernel.set_kernel_path(name)
            assert torch.equal(run_kernel(fastest.q4_linear, x, tiles), run_kernel(kernel.q4_linear, x, tiles)), name
    finally:
        kernel.set_kernel_path(before)


def test_every_source_and_header_of_the_kernels_is_compiled_or_in_the_builds_identity():
    """A file left out of both lists would change the module without changing its build folder: a stale build."""
    folder = Path(build.__file__).parent
    files = {
        str(path.relative_to(folder))
        for pattern in ("*.cpp", "*.h", "q4/*.cpp", "q4/*.h")
        for path in folder.glob(pattern)
    }
    listed = {*build.SOURCES, *code_paths.SOURCES.values(), *build.INCLUDED} - {build.PATHS_HERE}
    assert files == listed
