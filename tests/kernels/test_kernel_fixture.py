"""The `kernel` fixture (tests/conftest.py: kernel_or_skip) tells a machine without a C++ compiler, where the
kernel tests are skipped, from a build that fails, where they fail with the compiler's message: a change that
breaks the C++ must not turn every kernel test into a skip and leave the run green."""

from __future__ import annotations

import pytest
from conftest import kernel_or_skip

from specchat.kernels import build

COMPILE_ERROR = "q4_kernel.cpp:140:3: error: expected ';' before '}' token"


def test_a_compile_error_fails_the_kernel_tests_with_the_compilers_message(monkeypatch, tmp_path):
    (tmp_path / "build.log").write_text(f"RuntimeError: Error building extension 'specchat_q4':\n{COMPILE_ERROR}\n")
    monkeypatch.setattr(build, "q4_build_dir", lambda: tmp_path)
    monkeypatch.setattr(
        build,
        "kernel_problem",
        lambda *args, **kwargs: f"Error building extension 'specchat_q4' (build log: {tmp_path / 'build.log'})",
    )
    with pytest.raises(pytest.fail.Exception, match="did not build") as failed:
        kernel_or_skip()
    assert COMPILE_ERROR in str(failed.value)


def test_a_path_the_cpu_lacks_fails_them_too(monkeypatch):
    monkeypatch.setattr(
        build,
        "kernel_problem",
        lambda *args, **kwargs: "$SPECCHAT_KERNEL = amx: kernel path amx needs AMX-INT8, which this CPU lacks",
    )
    with pytest.raises(pytest.fail.Exception, match="which this CPU lacks"):
        kernel_or_skip()


def test_only_a_missing_compiler_skips_them(monkeypatch):
    monkeypatch.setenv("CXX", "specchat-no-such-compiler")
    monkeypatch.setattr(build, "kernel_problem", lambda *args, **kwargs: pytest.fail("the build was tried"))
    with pytest.raises(pytest.skip.Exception, match="no C\\+\\+ compiler .'specchat-no-such-compiler' is not on PATH"):
        kernel_or_skip()


def test_a_good_build_hands_the_module_over(kernel):
    assert kernel_or_skip() is kernel is build.q4_kernel()
