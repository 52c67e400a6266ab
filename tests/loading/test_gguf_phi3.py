"""A Phi-3 GGUF file (attn_qkv and a fused ffn_up, as llama.cpp's converter writes them), loaded as a user loads it:
on the fast path (its fused projections on the lean forward and the compiled layers), and exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from model_files import (
    _gguf_tensors,
    _write_gguf_header,
    _write_gguf_tokenizer,
    greedy_reply,
    logits,
    tiny_model,
    vocab_size,
    write_gguf,
    write_gguf_in,
)
from test_gguf_architectures import cache, default_pair, gguf_pair, on_the_cpu, prompt_ids, tok
from tiny_models import CHATML

from specchat.speculative import model_io

FIXTURES = (cache, on_the_cpu, tok)  # test_gguf_architectures' fixtures, on here too


def test_a_phi3_file_loads_with_the_default_config_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel):
    target, original, drafter = gguf_pair(tmp_path, tok, "phi3", tied=False)
    pair = default_pair(target, drafter)
    assert type(pair.target).__name__ == "Phi3ForCausalLM" and hasattr(pair.target.model.layers[0].mlp, "gate_up_proj")
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


@pytest.mark.slow  # the window and LongRoPE test below loads a phi3 file unquantized too
def test_a_phi3_file_unquantized_runs_lean_with_the_logits_of_the_model_it_was_written_from(tmp_path, tok, kernel):
    target, original, drafter = gguf_pair(tmp_path, tok, "phi3", tied=False)
    pair = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    assert pair.target_facts.backend == "lean"
    ids = torch.tensor([prompt_ids(tok)])
    with torch.inference_mode():
        ours = model_io.forward(pair.target, model_io.new_kv_cache(pair.target), ids[0].tolist(), keep=ids.shape[1])
    assert torch.allclose(ours, logits(original, tok, tok.decode(ids[0]))[0], atol=1e-4, rtol=0)
    assert greedy_reply(pair, "spec", ids[0].tolist()) == greedy_reply(pair, "target", ids[0].tolist())


LONGROPE = {  # a Phi-3.5-like rotary, small: original context 16, extended to 512
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.02, 1.1, 1.3, 1.6, 2.0, 2.4, 2.9],  # head_dim 16: 8 frequencies; not all 1
    "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
}
LONG_SHAPE = {"max_position_embeddings": 512, "original_max_position_embeddings": 16, "initializer_range": 0.2}


def write_phi3_gguf(path, model, tok):
    """A phi3 GGUF as llama.cpp's converter writes a Phi-3.5's: its window, rotated part, LongRoPE factors as
    tensors, original context and attention factor."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "phi3")
    _write_gguf_header(writer, config, "phi3")  # the window too
    writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    scale = config.max_position_embeddings / config.original_max_position_embeddings
    writer.add_rope_scaling_attn_factors(
        math.sqrt(1 + math.log(scale) / math.log(config.original_max_position_embeddings))
    )
    _write_gguf_tokenizer(writer, tok, CHATML)
    for name, values in _gguf_tensors(model, "phi3"):
        writer.add_tensor(name, values)
    parameters = config.rope_parameters
    writer.add_tensor("rope_factors_long.weight", np.array(parameters["long_factor"], dtype=np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(parameters["short_factor"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_phi3_files_window_and_longrope_reach_the_config_and_give_the_originals_logits(tmp_path, tok, kernel):
    """transformers' GGUF reader leaves them out (gguf/phi3.py puts them in): without them the model would rotate
    without its factors and read keys past its window."""
    original = tiny_model(
        "phi3", vocab_size(tok, "phi3"), seed=1, sliding_window=8, rope_parameters=LONGROPE, **LONG_SHAPE
    )
    target = write_phi3_gguf(tmp_path / "target.gguf", original, tok)
    drafter = write_gguf(
        tmp_path / "drafter.gguf", tiny_model("phi3", vocab_size(tok, "phi3"), seed=2), tok, architecture="phi3"
    )
    pair = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    config = pair.target.config
    assert config.sliding_window == 8 and config.original_max_position_embeddings == 16
    rope = config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 16
    assert np.allclose(rope["short_factor"], LONGROPE["short_factor"]) and np.allclose(
        rope["long_factor"], LONGROPE["long_factor"]
    )
    assert pair.target_facts.backend == "lean"
    text = "def reverse(lst):\n    return lst[::-1]\n" * 2  # past the window and the original context
    assert len(tok.encode(text)) > 16
    assert torch.allclose(logits(pair.target, tok, text), logits(original, tok, text), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_q4_k_phi3_files_fused_layers_run_on_its_own_blocks(tmp_path, tok, kernel):
    """attn_qkv and the fused ffn_up of a Q4_K file are the w4a8 qkv_proj and gate_up_proj bit for bit."""
    from gguf import GGUFReader

    from specchat.loading.gguf.blocks import decode_q4_k

    wide = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64}  # rows of whole 256-blocks
    model = tiny_model("phi3", vocab_size(tok, "phi3"), seed=1, **wide)
    target = write_gguf_in(tmp_path / "target.gguf", model, tok, "Q4_K", architecture="phi3", seed=3)
    drafter = write_gguf(
        tmp_path / "drafter.gguf", tiny_model("phi3", vocab_size(tok, "phi3"), seed=2), tok, architecture="phi3"
    )
    lines = []
    pair = default_pair(target, drafter, progress=lambda message, fraction: lines.append(message))
    assert pair.target_facts.backend == "lean (compiled layers)" and not [
        line for line in lines if "requantized" in line
    ]
    stored = {tensor.name: tensor for tensor in GGUFReader(str(target)).tensors}
    layer = pair.target.model.layers[1]
    for name, linear in (
        ("blk.1.attn_qkv.weight", layer.self_attn.qkv_proj),
        ("blk.1.ffn_up.weight", layer.mlp.gate_up_proj),
    ):
        block = decode_q4_k(torch.from_numpy(stored[name].data.copy()))
        assert torch.equal(linear.tiles.to_block().qs, block.qs) and torch.equal(linear.tiles.to_block().d, block.d), (
            name
        )
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Q5_K", "Q6_K", "Q8_0"])
def test_a_phi3_file_in_other_blocks_loads_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel, kind):
    wide = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64}  # rows of whole 256-blocks
    models = [tiny_model("phi3", vocab_size(tok, "phi3"), seed=seed, **wide) for seed in (1, 2)]
    target, drafter = (
        write_gguf_in(tmp_path / f"{name}.gguf", model, tok, kind, architecture="phi3", seed=seed)
        for name, model, seed in zip(("target", "drafter"), models, (3, 4))
    )
    pair = default_pair(target, drafter)
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)
