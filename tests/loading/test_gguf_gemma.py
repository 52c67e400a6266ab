"""Gemma-2 and Gemma-3 GGUF files (written small by the gguf package's writer, norms stored as 1 + w, a tied head)
load on the fast path: the lean forward unquantized, the compiled layers with the default w4a8, exact either way."""

from __future__ import annotations

import model_files
import pytest
import test_gguf_architectures as architectures
import torch
from model_files import greedy_reply, logits, tiny_model, vocab_size, write_gguf
from test_gguf_architectures import default_pair, prompt_ids
from tiny_models import CHATML, build_tokenizer

from specchat.speculative import model_io

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
    ours = model_io.forward(pair.target, model_io.new_kv_cache(pair.target), ids, keep=len(ids))
    assert len(ids) > 8 and torch.allclose(ours, logits(original, tok, tok.decode(ids))[0], atol=1e-4, rtol=0)


def test_a_gemma3_files_linear_rope_scaling_reaches_its_global_layers(tmp_path, tok):
    """Gemma-3 4B+ files state a linear rope scaling (factor 8) for the global layers, which transformers' reader
    leaves out: the loaded model has it, and gives the written model's logits (5 local layers, then a global)."""
    import gguf

    scaled = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    shape = SHAPE | {"num_hidden_layers": 6, "rope_parameters": scaled}
    models = [tiny_model("gemma3", vocab_size(tok, "gemma3"), seed=seed, tied=True, **shape) for seed in (1, 2)]
    paths = []
    for name, model in zip(("target", "drafter"), models):
        writer = gguf.GGUFWriter(str(tmp_path / f"{name}.gguf"), "gemma3")
        model_files._write_gguf_header(writer, model.config, "gemma3")
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(8.0)
        model_files._write_gguf_tokenizer(writer, tok, CHATML, model_files.EXTRA_TOKENS["gemma3"])
        for tensor, values in model_files._gguf_tensors(model, "gemma3"):
            writer.add_tensor(tensor, values)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(tmp_path / f"{name}.gguf")
    pair = default_pair(*paths, "target.quantization=none", "target.dtype=float32")
    assert pair.target.config.rope_parameters["full_attention"]["factor"] == 8.0
    assert pair.target.config.layer_types[-1] == "full_attention" and pair.target_facts.backend == "lean"
    ids = tok.encode("def reverse(lst):\n    return lst[::-1]\n")
    ours = model_io.forward(pair.target, model_io.new_kv_cache(pair.target), ids, keep=len(ids))
    assert torch.allclose(ours, logits(models[0], tok, tok.decode(ids))[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "architecture, kind",
    [
        (architecture, kind)
        if (architecture, kind) == ("gemma2", "Q4_K")
        else pytest.param(architecture, kind, marks=pytest.mark.slow)
        for architecture in ("gemma2", "gemma3")
        for kind in ("Q4_K", "Q5_K", "Q6_K", "Q8_0")
    ],
)
def test_a_gemma_file_in_blocks_loads_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel, architecture, kind):
    """Gemma files as users download them: every 2-d weight in `kind` blocks (tied head, block embeddings)."""
    shape = SHAPE | {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64}  # K-blocks hold 256 inputs
    models = [tiny_model(architecture, vocab_size(tok, architecture), seed=seed, tied=True, **shape) for seed in (1, 2)]
    target, drafter = (
        model_files.write_gguf_in(tmp_path / f"{name}.gguf", model, tok, kind, architecture=architecture, seed=seed)
        for name, model, seed in zip(("target", "drafter"), models, (1, 2))
    )
    pair = default_pair(target, drafter)
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)
