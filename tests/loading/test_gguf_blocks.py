"""A GGUF's Q4_K tensors become w4a8 blocks bit for bit (loading/gguf/blocks.py), checked against
gguf-py's own dequantizer, not against specchat's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize
from tiny_models import build_model

from specchat.loading.gguf.blocks import decode_q4_k, matching_blocks, module_name, q4_k_blocks


def random_q4_k(rows: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, width/256·144] of Q4_K blocks with random bytes and small, finite fp16 d and dmin."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-2, size=(rows, width // 256, 2)).astype(np.float16)
    raw[..., 0:4] = scales.view(np.uint8).reshape(rows, width // 256, 4)
    return raw.reshape(rows, -1)


def test_decoded_q4_k_blocks_give_gguf_pys_own_weights():
    raw = random_q4_k(6, 512)
    expected = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_K).astype(np.float32))
    block = decode_q4_k(torch.from_numpy(raw))
    assert block.qs.shape == (6, 256) and block.d.shape == (6, 2) and int(block.sc.max()) <= 63
    assert torch.allclose(block.dequantize(), expected, rtol=0, atol=1e-6 * expected.abs().max().item())


def test_gguf_names_map_to_transformers_modules():
    assert module_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert module_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj"
    assert module_name("output.weight") == "lm_head"
    assert module_name("blk.0.attn_q.bias") is None and module_name("token_embd.weight") is None


@pytest.fixture
def tiny_gguf(tmp_path, tokenizer):
    """A GGUF with two Q4_K weights and one float one, and a tiny model holding the first's weights."""
    model = build_model(len(tokenizer), seed=1, layers=1, hidden=256)
    q_raw, up_raw = random_q4_k(256, 256, seed=1), random_q4_k(512, 256, seed=2)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.copy_(
            torch.from_numpy(dequantize(q_raw, GGMLQuantizationType.Q4_K).astype(np.float32))
        )
    writer = GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    writer.add_tensor("blk.0.attn_q.weight", q_raw, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.add_tensor("blk.0.ffn_up.weight", up_raw, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((128, 256), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    return tmp_path / "tiny.gguf", model


def test_only_q4_k_layers_that_decode_to_the_loaded_weights_are_taken(tiny_gguf):
    path, model = tiny_gguf
    assert set(q4_k_blocks(path)) == {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"}
    kept = matching_blocks(path, model)
    assert set(kept) == {"model.layers.0.self_attn.q_proj"}  # up_proj holds other weights: quantized from them
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(kept["model.layers.0.self_attn.q_proj"].dequantize(), q_proj)


def test_a_w4a8_model_from_a_gguf_runs_its_q4_k_layers_on_the_files_blocks(tiny_gguf, tmp_path):
    from specchat.loading import stored_weights
    from specchat.quant.w4a8 import Q4Linear

    path, model = tiny_gguf
    stored = tmp_path / "tiny-float32-w4a8.safetensors"
    stored_weights.load_or_quantize(model, stored, "tiny", "w4a8", gguf=lambda: path)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, Q4Linear)
    assert torch.equal(
        layer.self_attn.q_proj.tiles.to_block().qs, decode_q4_k(torch.from_numpy(random_q4_k(256, 256, 1))).qs
    )
    assert layer.mlp.up_proj.tiles.bits == 6  # not Q4_K in the model: 6-bit levels, four in three bytes
    assert layer.mlp.down_proj.tiles.to_block().qs.shape[1] * 4 == layer.mlp.down_proj.in_features * 3 == 512 * 3
