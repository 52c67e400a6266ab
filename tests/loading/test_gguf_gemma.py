"""Gemma-2 and Gemma-3 GGUF files (written small by the gguf package's writer, norms stored as 1 + w, a tied head)
load on the fast path: the lean forward unquantized, the compiled layers with the default w4a8, exact either way."""

from __future__ import annotations

import pytest
import test_gguf_architectures as architectures
import torch
from model_files import greedy_reply, logits, tiny_model, vocab_size, write_gguf
from test_gguf_architectures import default_pair, prompt_ids
from tiny_models import build_tokenizer

from specchat.spec import model_io

on_the_cpu, cache = architectures.on_the_cpu, architectures.cache  # its autouse fixtures, here too
SHAPE = {"head_dim": 32, "sliding_window": 8}  # query_pre_attn_scalar: no GGUF key, the default 256


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def gemma_pair(folder, tok, architecture: str):
    """(target file, its model, drafter file): tied heads, a window of 8 on alternate layers."""
    models = [tiny_model(architecture, vocab_size(tok, architecture), seed=seed, tied=True, **SHAPE) for seed in (1, 2)]
    paths = [
        write_gguf(folder / f"{name}.gguf", model, tok, architecture=architecture)
        for name, model in zip(("target", "drafter"), models)
    ]
    return paths[0], models[0], paths[1]


@pytest.mark.parametrize("architecture", ["gemma2", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_a_gemma_file_loads_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel, architecture):
    target, _, drafter = gemma_pair(tmp_path, tok, architecture)
    pair = default_pair(target, drafter)
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_an_unquantized_gemma_file_runs_lean_with_the_logits_it_was_written_with(tmp_path, tok, architecture):
    """The file's model on the lean forward: transformers' logits of the model written, past the window."""
    target, original, drafter = gemma_pair(tmp_path, tok, architecture)
    pair = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    assert pair.target_facts.backend == "lean"
    ids = tok.encode("def reverse(lst):\n    return lst[::-1]\n")
    ours = model_io.forward(pair.target, model_io.new_cache(pair.target), ids, keep=len(ids))
    assert len(ids) > 8 and torch.allclose(ours, logits(original, tok, tok.decode(ids))[0], atol=1e-4, rtol=0)
