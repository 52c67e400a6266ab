"""Phi-3 on the fast path (runtime/fused.py, runtime/rope.py): its fused qkv_proj and gate_up_proj run on the lean
forward (transformers' logits within float rounding) and on the compiled layer loop (the Python loop's within
rounding, batch-invariant bitwise), greedy speculation stays exact on both and LongRoPE takes its short or long factors
per position. (A Phi-3 whose rotary covers part of a head keeps transformers' forward: test_architecture_table.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only, noisy_head_copy
from model_files import tiny_model
from test_lean import logits_in_pieces
from test_lean_native import assert_near_the_python_loop, run_steps, w4a8

from specchat.runtime import fused, lean
from specchat.runtime.lean import LeanForward, LeanKVCache
from specchat.speculative import model_io

VOCAB = 384
IDS = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).tolist()
WIDE = {"hidden_size": 256, "intermediate_size": 512, "initializer_range": 0.2}  # w4a8: heads of 64, widths of 64
LONGROPE = {  # original context 16, extended to 512: long factors from position 16 on
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],  # head_dim 16: 8 frequencies
    "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
    "original_max_position_embeddings": 16,
}


def phi3(seed: int = 3, **shape):
    return tiny_model("phi3", VOCAB, seed=seed, **shape)


def lean_copy(model):
    copied = copy.deepcopy(model)
    assert lean.attach_lean(copied) == ""
    return copied


def test_phi3s_fused_layers_run_on_the_lean_forward_with_transformers_logits():
    model = phi3()
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert fused.qkv_layers(attention) == [attention.qkv_proj] and fused.gate_up_layers(mlp) == [mlp.gate_up_proj]
    for pieces, crop in (([1, 4, 7], 3), ([12], 0)):
        ours = logits_in_pieces(lean_copy(model), IDS, 20, pieces, crop)
        theirs = logits_in_pieces(model, IDS, 20, pieces, crop)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_a_phi3_with_a_sliding_window_runs_lean_with_transformers_logits():
    """Phi-3-mini-4k's config has a window (2047 keys): transformers' Phi-3 reads it from the config, as the lean
    forward does."""
    model = phi3(sliding_window=8, initializer_range=0.2)
    ours = logits_in_pieces(lean_copy(model), IDS, 20, [1, 4, 7])  # no crop: transformers' window cache has none
    assert torch.allclose(ours, logits_in_pieces(model, IDS, 20, [1, 4, 7]), atol=1e-4, rtol=0)
    unwindowed = logits_in_pieces(lean_copy(phi3(initializer_range=0.2)), IDS, 20, [1, 4, 7])
    assert not torch.allclose(ours, unwindowed, atol=1e-3, rtol=0)


@pytest.mark.slow  # the compiled layers' test below runs the same engine on the fused layers
def test_greedy_speculative_equals_target_only_on_phi3s_lean_forward(tokenizer):
    target = lean_copy(phi3(seed=1, initializer_range=0.2))
    drafter = noisy_head_copy(target)
    lean.attach_lean(drafter)
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", 4)


def test_phi3s_compiled_layers_give_the_python_loops_logits_within_rounding(kernel):
    """The fused qkv_proj and gate_up_proj go to the C++ loop as one product each (q|k|v, gate|up side by side)."""
    unquantized = LeanForward(phi3(**WIDE))
    model = w4a8(phi3(**WIDE), kernel)
    native, python = LeanForward(model, kernel.LeanLayers, kv_cache="float32"), LeanForward(model)
    assert native.native_reason == "" and native.native_loop() is not None and python.native_loop() is None
    compiled, looped, exact = run_steps(native, IDS), run_steps(python, IDS), run_steps(unquantized, IDS)
    assert_near_the_python_loop(compiled, looped, exact)


def test_phi3s_compiled_layers_give_a_row_bitwise_alone_or_in_a_batch(kernel):
    forward = LeanForward(w4a8(phi3(**WIDE), kernel), kernel.LeanLayers)
    batched, single = LeanKVCache(forward), LeanKVCache(forward)
    for cache in (batched, single):
        forward(cache, torch.tensor([IDS[:33]]), keep=1)
        cache.crop_to(30)  # a rollback: the next rows overwrite cached ones
    rows = forward(batched, torch.tensor([IDS[30:35]]), keep=5)
    for offset, token in enumerate(IDS[30:35]):
        assert torch.equal(rows[offset : offset + 1], forward(single, torch.tensor([[token]]), keep=1)), offset


def test_greedy_speculative_equals_target_only_on_phi3s_compiled_layers(tokenizer, kernel):
    target = w4a8(phi3(seed=1, **WIDE), kernel)
    drafter = w4a8(noisy_head_copy(phi3(seed=1, **WIDE)), kernel)
    assert lean.attach_lean(target, kernel.LeanLayers) == "" and lean.attach_lean(drafter, kernel.LeanLayers) == ""
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", 4)
    assert getattr(target, model_io.RUNNER).native_loop() is not None


def test_longrope_takes_the_short_factors_below_the_original_context_and_the_long_ones_past_it(monkeypatch):
    """Fed a few tokens at a time across position 16, transformers' logits; the same whatever the cache's capacity
    (its tables computed for 1024 positions, or grown from 8); and the long factors change the logits past 16."""
    sharp = {"max_position_embeddings": 512, "original_max_position_embeddings": 16, "initializer_range": 0.2}
    model = phi3(rope_parameters=LONGROPE, **sharp)
    pieces = [1] * 6 + [3, 2, 1, 4]  # from 12 tokens on: one-token steps, then a few rows across no boundary
    theirs = logits_in_pieces(model, IDS, 12, pieces)
    ours = logits_in_pieces(lean_copy(model), IDS, 12, pieces)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)
    monkeypatch.setattr(lean, "FIRST_CAPACITY", 8)
    assert torch.allclose(logits_in_pieces(lean_copy(model), IDS, 12, pieces), ours, atol=1e-5, rtol=0)
    short_only = phi3(rope_parameters=LONGROPE | {"long_factor": LONGROPE["short_factor"]}, **sharp)
    plain = logits_in_pieces(lean_copy(short_only), IDS, 12, pieces)
    assert torch.allclose(plain[:4], ours[:4], atol=1e-5, rtol=0)  # positions 12 … 15: short factors either way
    assert not torch.allclose(plain[4:], ours[4:], atol=1e-3, rtol=0)


def test_a_windowed_phi3_runs_on_the_compiled_layers_as_on_the_python_loop(kernel):
    """Phi-3-mini-4k's window (2047 keys; 8 here) on the compiled loop: the Python loop's logits within rounding."""
    model = w4a8(phi3(sliding_window=8, **WIDE), kernel)
    native, python = LeanForward(model, kernel.LeanLayers, kv_cache="float32"), LeanForward(model)
    assert native.native_reason == ""
    unwindowed = run_steps(LeanForward(w4a8(phi3(**WIDE), kernel)), IDS)
    for index, (a, b, c) in enumerate(zip(run_steps(native, IDS), run_steps(python, IDS), unwindowed)):
        error, moved = (a - b).abs().mean().item(), (b - c).abs().mean().item()
        assert error < 0.05 * moved, f"forward {index}: {error} from the Python loop (the window moves {moved})"


def test_a_phi3_rotating_part_of_each_head_runs_lean_and_keeps_the_python_loop(kernel):
    """Phi-4-mini (model type phi3) rotates 3/4 of each head: the lean forward rotates that part and passes the rest,
    as transformers does (test_architecture_table.py compares the logits); the compiled loop rotates whole heads
    only, so a w4a8 model of it runs the Python loop and says why."""
    model = w4a8(phi3(partial_rotary_factor=0.75, **WIDE), kernel)
    forward = LeanForward(model, kernel.LeanLayers)
    assert forward.native_reason == "phi3 needs rotary over part of a head, which the compiled layer loop lacks"
    assert (
        forward.native_loop() is None
        and forward(LeanKVCache(forward), torch.tensor([IDS[:5]]), keep=1).isfinite().all()
    )


def test_phi3s_fused_qkv_proj_takes_one_w8a8_pass_as_llamas_q_k_v_do():
    """w8a8's rule: one activation pass for the attention projections, two for the MLP and the head."""
    from specchat.quant.w8a8 import activation_passes

    assert activation_passes("model.layers.0.self_attn.qkv_proj") == activation_passes("x.self_attn.q_proj") == 1
    assert activation_passes("model.layers.0.mlp.gate_up_proj") == activation_passes("x.mlp.up_proj") == 2


def test_a_w8a8_phi3_on_the_lean_forward_scores_a_row_the_same_alone_in_a_batch_or_after_a_crop():
    from specchat.quant.w8a8 import quantize_w8a8
    from specchat.runtime.attention import use_batch_invariant_attention

    model = phi3(hidden_size=256, intermediate_size=512)
    quantize_w8a8(model)
    use_batch_invariant_attention(model)
    lean_model = lean_copy(model)
    one_by_one = logits_in_pieces(lean_model, IDS, 31, [1] * 9)
    for pieces, crop in (([9], 0), ([2, 3, 4], 6)):
        assert torch.equal(one_by_one, logits_in_pieces(lean_model, IDS, 31, pieces, crop))
    assert torch.allclose(one_by_one, logits_in_pieces(model, IDS, 31, [1] * 9), atol=1e-4, rtol=0)
