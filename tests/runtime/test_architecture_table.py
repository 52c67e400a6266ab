"""The architecture table (runtime/architectures.py): each architecture's needs read from its config, the lean
forward run on every architecture whose needs it covers (logits within float rounding of transformers' forward,
greedy speculative == target-only), and the others left to transformers with the need named."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only, noisy_head_copy
from model_files import tiny_model
from test_lean import logits_in_pieces as pieces_after_a_crop

from specchat.runtime import architectures, lean
from specchat.speculative import model_io

IDS = torch.randint(0, 384, (40,), generator=torch.Generator().manual_seed(1)).tolist()
LEAN = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {},
    "qwen3 head 32": {"head_dim": 32},
    "phi3": {},
    "phi3 rotary 0.5": {"partial_rotary_factor": 0.5},  # Phi-4-mini's is 0.75
}
LACKED = {
    "phi3 rotary 0.5": ("partial_rotary", "needs rotary over part of a head,")
}  # sliding windows, Gemma: test_gemma.py


def built(name: str, **extra):
    architecture = name.split()[0]
    shape = (LEAN.get(name) or {}) | extra
    return tiny_model(architecture, 384, seed=3, **shape)


def logits_in_pieces(model, ids: list[int], prefix: int, pieces: list[int]) -> torch.Tensor:
    """test_lean's: logits of ids[prefix:] fed in pieces after the prefix and a rejected 3-token draft."""
    return pieces_after_a_crop(model, ids, prefix, pieces, crop_first=3)


def lean_copy(model):
    copied = copy.deepcopy(model)
    assert lean.attach_lean(copied) == ""
    return copied


@pytest.mark.parametrize("name", LEAN)
def test_the_lean_forward_gives_transformers_logits_on_each_architecture_it_runs(name):
    model = built(name)
    ours = logits_in_pieces(lean_copy(model), IDS, 20, [1, 4, 7])
    theirs = logits_in_pieces(model, IDS, 20, [1, 4, 7])
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_qwen3_q_and_k_norms_are_applied_per_head():
    """Without its q/k norms (a loop that skipped them) the lean forward would not match: the test can fail."""
    model = built("qwen3 head 32")
    skipped = lean_copy(model)
    for layer in skipped.model.layers:
        del layer.self_attn.q_norm, layer.self_attn.k_norm
    assert not torch.allclose(
        logits_in_pieces(skipped, IDS, 20, [5]), logits_in_pieces(model, IDS, 20, [5]), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("name", ["qwen3 head 32", "mistral"])
def test_greedy_speculative_equals_target_only_on_the_lean_forward(tokenizer, name):
    target = lean_copy(built(name, initializer_range=0.2))
    drafter = noisy_head_copy(target)
    lean.attach_lean(drafter)
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", 4)


def test_llama3_rope_scaling_runs_on_the_lean_forward_as_on_transformers():
    """Llama-3's rope scaling (rope_type llama3) comes from the model's own rotary module: the lean forward's
    positions past the original context get it too, and it changes the logits (the test can fail)."""
    scaled = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    model = built("llama", rope_parameters=scaled)
    plain = built("llama")
    ours = logits_in_pieces(lean_copy(model), IDS, 20, [1, 4, 7])
    assert torch.allclose(ours, logits_in_pieces(model, IDS, 20, [1, 4, 7]), atol=1e-4, rtol=0)
    assert not torch.allclose(ours, logits_in_pieces(plain, IDS, 20, [1, 4, 7]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("name, lacked", LACKED.items())
def test_other_architectures_keep_transformers_forward_and_name_what_they_need(name, lacked, monkeypatch):
    """Every need of the table runs on the lean forward now: one taken out of LEAN_RUNS shows the fallback."""
    monkeypatch.setattr(architectures, "LEAN_RUNS", architectures.LEAN_RUNS - {lacked[0]})
    model, need = built(name), lacked[1]
    reason = lean.attach_lean(model)
    assert need in reason and type(model).__name__ in reason and "the lean forward lacks" in reason
    assert not hasattr(model, model_io.RUNNER) and isinstance(
        model_io.new_kv_cache(model), model_io.TransformersKVCache
    )


def test_needs_come_from_the_table_and_from_the_config():
    needs = lambda name, **extra: architectures.model_needs(built(name, **extra).config)
    assert needs("llama") == frozenset() and needs("qwen2") == {"qkv_bias"} and needs("qwen3") == {"qk_norm"}
    assert needs("llama", attention_bias=True) == {"qkv_bias"}
    assert needs("mistral", sliding_window=4096) == {"sliding_window"}
    assert needs("qwen2", use_sliding_window=False, sliding_window=4096) == {"qkv_bias"}
    assert "sliding_window" in needs("gemma2") and "partial_rotary" in needs("phi3", partial_rotary_factor=0.5)
    assert architectures.model_needs(type("C", (), {"model_type": "gpt2", "get_text_config": lambda s: s})()) is None
