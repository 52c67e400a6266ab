"""Shared fixtures: tiny random models and a tiny byte-level BPE tokenizer built offline from a config.

The helpers tests import from here (`from conftest import make_engine`) live in helpers.py, loaded on
first use. This file imports torch and specchat only inside its hooks and fixtures: pytest-xdist's
controller (`make test-fast`) loads it but runs no test, and so starts its workers seconds sooner."""
from __future__ import annotations

import os

import pytest

HELPERS = ("GREEDY", "CheapDrafterGamma", "ScriptedEngine", "assert_greedy_spec_is_target_only",
           "assert_multi_turn_exact", "hf_greedy", "make_engine", "noisy_head_copy", "prompt_ids",
           "reference_probs", "run_reply", "scripted_reply")


def __getattr__(name: str):
    """`from conftest import make_engine` and the like: the name from helpers.py."""
    if name not in HELPERS:
        raise AttributeError(f"module 'conftest' has no attribute {name!r}")
    import helpers
    return getattr(helpers, name)


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`, the fast default) each worker, and every process it starts, computes
    on one thread: the workers already take a core each, and more threads than cores wait for each
    other. A plain run (`make test`) keeps torch's default, so the kernels' threaded paths run too."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def kernel():
    """The w4a8 kernel module, built once per machine into specchat's cache; where it cannot be built
    (no C++ compiler), the tests that need it are skipped with the reason."""
    from specchat.kernels.build import kernel_problem, q4_kernel
    problem = kernel_problem()
    if problem:
        pytest.skip(f"the w4a8 kernel cannot be built here: {problem}")
    return q4_kernel()


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
