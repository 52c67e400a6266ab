"""Shared fixtures: tiny random models and a tiny byte-level BPE tokenizer built offline from a config.

The helpers tests import from here (`from conftest import make_engine`) live in helpers.py, loaded on
first use. This file imports torch and specchat only inside its hooks and fixtures: pytest-xdist's
controller (`make test-fast`) loads it but runs no test, and so starts its workers seconds sooner."""

from __future__ import annotations

import os

import pytest

from specchat.threads import set_wait_policy

set_wait_policy()  # the tests run torch as the programs do (threads.py); importing specchat sets nothing
# The kernel with every code path this CPU runs, so that the tests compare them all (kernels/build.py); a user's start
# builds only the fastest (tests/kernels/test_code_paths.py checks that build). SPECCHAT_KERNEL_BUILD=fastest: the same
# tests on the build users run.
os.environ.setdefault("SPECCHAT_KERNEL_BUILD", "every")

HELPERS = (
    "GREEDY",
    "CheapDrafterGamma",
    "FixedCostGamma",
    "ScriptedEngine",
    "assert_greedy_spec_is_target_only",
    "assert_multi_turn_exact",
    "hf_greedy",
    "make_engine",
    "noisy_head_copy",
    "prompt_ids",
    "reference_probs",
    "run_reply",
    "scripted_reply",
)


def __getattr__(name: str):
    """`from conftest import make_engine` and the like: the name from helpers.py."""
    if name not in HELPERS:
        raise AttributeError(f"module 'conftest' has no attribute {name!r}")
    import helpers

    return getattr(helpers, name)


def pytest_collection_modifyitems(config, items):
    """The probes of bad input and faults (tests/probes.py) carry the `probe` marker: `pytest -m probe` runs them."""
    from probes import is_probe

    for item in items:
        if is_probe(item.nodeid):
            item.add_marker(pytest.mark.probe)


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`, the fast default) each worker, and every process it starts, computes
    on one thread: the workers already take a core each, and more threads than cores wait for each
    other. A plain run (`make test`) keeps torch's default, so the kernels' threaded paths run too."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def kernel_or_skip():
    """The w4a8 kernel module, built once per machine into specchat's cache. Where no C++ compiler exists
    ($CXX, else c++) the test is skipped; where one exists and the module still cannot be had (a compile
    error, a path $SPECCHAT_KERNEL names that this CPU lacks) the test fails, with the compiler's message:
    a change that breaks the build must not turn every kernel test into a skip."""
    import shutil

    from specchat.kernels import build

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"the w4a8 kernel cannot be built here: no C++ compiler ({compiler!r} is not on PATH)")
    problem = build.kernel_problem()
    if problem:
        pytest.fail(f"the w4a8 kernel did not build with {compiler}: {problem}{_build_log_tail(build)}", pytrace=False)
    return build.q4_kernel()


def _build_log_tail(build, lines: int = 40) -> str:
    """The compiler's errors from the failed build's log (its last lines when none says error), or ''."""
    try:
        text = (build.q4_build_dir() / "build.log").read_text(errors="replace").splitlines()
    except (OSError, AttributeError):
        return ""
    errors = [line for line in text if "error" in line.lower()]
    return "\n" + "\n".join((errors or text)[-lines:])


@pytest.fixture(scope="module")
def one_thread():
    """A module's tiny models on one thread (`pytestmark = pytest.mark.usefixtures("one_thread")`): on two threads
    shared with anything else each forward costs far more."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def kernel():
    """The w4a8 kernel module (kernel_or_skip): skipped only where no C++ compiler exists."""
    return kernel_or_skip()


@pytest.fixture(scope="session")
def tokenizer():
    from tiny_models import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def target(tokenizer):
    from tiny_models import build_model

    return build_model(len(tokenizer), seed=1, layers=3)


@pytest.fixture(scope="session")
def unrelated_drafter_model(tokenizer):
    from tiny_models import build_model

    return build_model(len(tokenizer), seed=2, layers=1, hidden=32)


@pytest.fixture(scope="session")
def similar_drafter_model(target):
    """The target with a noisy output head: agrees often, not always (mixed accept/reject steps)."""
    import copy

    import torch

    drafter = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        head = drafter.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * head.std() * 0.6)
    return drafter


@pytest.fixture(scope="session")
def int8_drafter_model(similar_drafter_model):
    """The similar drafter with weight-only int8 layers (its q differs a little from the float one)."""
    import copy

    from specchat.quant.int8_weights import quantize_linears

    drafter = copy.deepcopy(similar_drafter_model)
    quantize_linears(drafter)
    return drafter


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own ($SPECCHAT_CACHE), empty; a module with its own `cache` fixture uses that."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    return root


@pytest.fixture
def head_on_target(target, tokenizer, monkeypatch):
    """The target with a draft head trained for it (the `head` drafter's), taken off again after the test."""
    from helpers import trained_head

    from specchat.speculative import model_io

    head, learnt, rows = trained_head(target, tokenizer)
    monkeypatch.setattr(target, model_io.DRAFT_HEAD, head, raising=False)
    monkeypatch.setattr(target, model_io.FEATURES, False, raising=False)  # restored after (the drafter sets it)
    return head, learnt, rows
