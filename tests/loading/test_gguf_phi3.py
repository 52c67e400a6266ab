"""A Phi-3 GGUF file (attn_qkv and a fused ffn_up, as llama.cpp's converter writes them), loaded as a user loads it:
on the fast path (its fused projections on the lean forward and the compiled layers), and exact."""

from __future__ import annotations

import torch
from model_files import greedy_reply, logits
from test_gguf_architectures import cache, default_pair, gguf_pair, on_the_cpu, prompt_ids, tok

from specchat.spec import model_io

FIXTURES = (cache, on_the_cpu, tok)  # test_gguf_architectures' fixtures, on here too


def test_a_phi3_file_loads_with_the_default_config_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel):
    target, original, drafter = gguf_pair(tmp_path, tok, "phi3", tied=False)
    pair = default_pair(target, drafter)
    assert type(pair.target).__name__ == "Phi3ForCausalLM" and hasattr(pair.target.model.layers[0].mlp, "gate_up_proj")
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


def test_a_phi3_file_unquantized_runs_lean_with_the_logits_of_the_model_it_was_written_from(tmp_path, tok):
    target, original, drafter = gguf_pair(tmp_path, tok, "phi3", tied=False)
    pair = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    assert pair.target_facts.backend == "lean"
    ids = torch.tensor([prompt_ids(tok)])
    with torch.inference_mode():
        ours = model_io.forward(pair.target, model_io.new_cache(pair.target), ids[0].tolist(), keep=ids.shape[1])
    assert torch.allclose(ours, logits(original, tok, tok.decode(ids[0]))[0], atol=1e-4, rtol=0)
    assert greedy_reply(pair, "spec", ids[0].tolist()) == greedy_reply(pair, "target", ids[0].tolist())
