"""Gemma-2 and Gemma-3 (text) on the fast path: the lean forward gives transformers' logits within float rounding,
past a sliding window of 8 keys, with each Gemma need doing its part (turned off, the logits move); the compiled
layer loop gives the Python loop's logits on the same w4a8 model within rounding, batch-invariant bit for bit;
greedy speculative == target-only through the engine on both."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only, noisy_head_copy
from model_files import tiny_model
from test_lean import logits_in_pieces
from test_lean_native import assert_near_the_python_loop, run_steps, w4a8

from specchat.quant.w8a8 import quantize_w8a8
from specchat.runtime import lean
from specchat.runtime.attention import use_batch_invariant_attention
from specchat.runtime.lean import LeanForward, LeanKVCache
from specchat.speculative import model_io

WINDOW = 8
IDS = torch.randint(0, 384, (48,), generator=torch.Generator().manual_seed(1)).tolist()
LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
# Gemma-3's global layers: their own base and a linear rope scaling (as Gemma-3 4B's), its local layers another base.
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}
SHAPES = {
    # soft-capping low enough to bend these random weights' scores and logits; a scale other than head_dim's
    "gemma2": {"attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
    "gemma3": {"rope_parameters": GEMMA3_ROPE, "final_logit_softcapping": 3.0},
}


def gemma(architecture: str, seed: int = 3, **shape) -> torch.nn.Module:
    """A tiny random Gemma of 3 layers (local, global, local), a window of 8 keys, heads of 32, float32."""
    base = {
        "num_hidden_layers": 3,
        "layer_types": LAYERS,
        "sliding_window": WINDOW,
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "initializer_range": 0.2,
    }
    return tiny_model(architecture, 384, seed=seed, **(base | SHAPES[architecture] | shape))


def lean_copy(model):
    copied = copy.deepcopy(model)
    assert lean.attach_lean(copied) == ""
    return copied


@torch.inference_mode()
def transformers_logits(model, ids: list[int], rows: int) -> torch.Tensor:
    """The last `rows` logits of transformers' forward over all of ids at once (no cache)."""
    return model(torch.tensor([ids])).logits[0, -rows:]


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3", "mistral"])
def test_the_lean_forward_gives_transformers_logits_past_the_sliding_window(architecture):
    """A prompt of 20 (2.5 windows), a rejected draft, then one-token steps and verifications: every row's
    logits within float rounding of transformers' forward over the whole sequence (transformers' own cache
    cannot crop a window it has slid). Mistral: a window on every layer."""
    model = (
        tiny_model("mistral", 384, seed=3, sliding_window=WINDOW) if architecture == "mistral" else gemma(architecture)
    )
    ours = logits_in_pieces(lean_copy(model), IDS, 20, [1, 1, 4, 9, 13], crop_first=5)
    theirs = transformers_logits(model, IDS, 28)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_each_gemma_need_moves_the_logits(architecture):
    """The test above can fail: the lean forward without its window, its soft-capping or Gemma-3's local rotary
    table gives other logits; its logits with them are transformers'."""
    model = gemma(architecture)
    theirs = transformers_logits(model, IDS, 20)
    broken = {
        "no window": lambda forward: setattr(forward, "windows", [None] * len(forward.windows)),
        "no final soft-capping": lambda forward: setattr(forward, "logit_cap", None),
    }
    if architecture == "gemma2":
        broken["no attention soft-capping"] = lambda forward: setattr(forward, "attention_cap", None)
    else:
        broken["one rotary table"] = lambda forward: setattr(forward, "rope_types", ["full_attention"] * 3)
    for name, breaking in broken.items():
        copied = lean_copy(model)
        breaking(getattr(copied, model_io.RUNNER))
        ours = logits_in_pieces(copied, IDS, 28, [1, 4, 15])
        assert not torch.allclose(ours, theirs, atol=1e-3, rtol=0), name
    assert torch.allclose(logits_in_pieces(lean_copy(model), IDS, 28, [1, 4, 15]), theirs, atol=1e-4, rtol=0)


def test_gemma3_norms_its_queries_and_keys_and_both_scale_their_embeddings():
    """Gemma-3's q/k norms and both Gemma's embedding scale are the model's own modules': left out, the logits
    move."""
    for architecture in ("gemma2", "gemma3"):
        model = gemma(architecture)
        theirs = transformers_logits(model, IDS, 20)
        unscaled = lean_copy(model)
        unscaled.model.embed_tokens.embed_scale.fill_(1.0)
        assert not torch.allclose(logits_in_pieces(unscaled, IDS, 28, [20]), theirs, atol=1e-3, rtol=0)
    skipped = lean_copy(gemma("gemma3"))
    for layer in skipped.model.layers:
        del layer.self_attn.q_norm, layer.self_attn.k_norm
    assert not torch.allclose(logits_in_pieces(skipped, IDS, 28, [20]), theirs, atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_a_lean_w8a8_gemma_scores_a_row_the_same_alone_in_a_batch_or_after_a_crop(architecture, dtype):
    """Past the window, with soft-capping: five rows verified at once are five one-token steps bit for bit (what
    keeps greedy speculation exact on the Python loop). A windowed row reads its keys from 0, those before its
    window masked: a slice from each row's window start gave other float32 sums in a batch."""
    model = gemma(architecture, hidden_size=256, intermediate_size=512, head_dim=64)
    quantize_w8a8(model)
    use_batch_invariant_attention(model)
    model = lean_copy(model.to(dtype))
    one_by_one = logits_in_pieces(model, IDS, 31, [1] * 9)
    for pieces, crop in (([9], 0), ([5, 4], 0), ([2, 3, 4], 0), ([9], 6)):
        assert torch.equal(one_by_one, logits_in_pieces(model, IDS, 31, pieces, crop)), (pieces, crop)


def test_an_embedding_module_that_does_not_scale_is_scaled_by_the_lean_forward():
    """A GGUF's embeddings in blocks (BlockEmbedding) are a plain lookup: the lean forward scales their rows by
    √hidden itself (cast to the dtype, as Gemma's module does), and so gives the model's logits."""
    model = gemma("gemma2")
    theirs = transformers_logits(model, IDS, 20)
    plain = lean_copy(model)
    scaled = plain.model.embed_tokens
    plain.model.embed_tokens = torch.nn.Embedding.from_pretrained(scaled.weight.detach().clone())
    assert lean.attach_lean(plain) == "" and getattr(plain, model_io.RUNNER).embed_scale is not None
    assert torch.allclose(logits_in_pieces(plain, IDS, 28, [20]), theirs, atol=1e-4, rtol=0)


@pytest.mark.slow  # the compiled loop's below runs the engine on gemma2 in the quick suite
@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_greedy_speculative_equals_target_only_on_lean_gemma(tokenizer, architecture):
    target = lean_copy(gemma(architecture))
    drafter = noisy_head_copy(target)
    assert lean.attach_lean(drafter) == ""
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", 4)


# ----- the compiled layer loop (w4a8) ------------------------------------------------------------------------------
WIDE = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "query_pre_attn_scalar": 48}  # w4a8's widths


def w4a8_gemma(architecture: str, kernel, seed: int = 3):
    """A gemma() wide enough for the w4a8 kernel (hidden 256, heads of 64), quantized."""
    return w4a8(gemma(architecture, seed, **WIDE), kernel)


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_the_compiled_layers_give_the_python_loops_gemma_logits_within_rounding(kernel, architecture):
    """The same w4a8 model through the compiled loop and the Python loop, past the window (a prompt of 20, steps,
    a verification, a rollback): far closer to each other than either is to the unquantized model."""
    unquantized = LeanForward(gemma(architecture, **WIDE))
    model = w4a8_gemma(architecture, kernel)
    native, python = LeanForward(model, kernel.LeanLayers, kv_cache="float32"), LeanForward(model)
    assert native.native_reason == "" and native.native_loop() is not None and python.native_loop() is None
    compiled, looped, exact = run_steps(native, IDS), run_steps(python, IDS), run_steps(unquantized, IDS)
    assert_near_the_python_loop(compiled, looped, exact)


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3"])
def test_the_compiled_gemma_layers_give_a_row_bitwise_alone_or_in_a_batch(kernel, architecture):
    """Windows and soft-capping keep the loop batch-invariant: five rows verified at once are five one-token steps,
    before and past the window, after a rollback."""
    lean = LeanForward(w4a8_gemma(architecture, kernel), kernel.LeanLayers, "bfloat16")
    for prompt in (3, 30):
        batched, single = LeanKVCache(lean), LeanKVCache(lean)
        for cache in (batched, single):
            lean(cache, torch.tensor([IDS[: prompt + 3]]), keep=1)
            cache.crop_to(prompt)
        rows = lean(batched, torch.tensor([IDS[prompt : prompt + 5]]), keep=5)
        for offset, token in enumerate(IDS[prompt : prompt + 5]):
            assert torch.equal(rows[offset : offset + 1], lean(single, torch.tensor([[token]]), keep=1)), (
                prompt,
                offset,
            )


@pytest.mark.parametrize("architecture", ["gemma2", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_greedy_speculative_equals_target_only_on_compiled_gemma(tokenizer, kernel, architecture):
    target = w4a8_gemma(architecture, kernel, seed=1)
    drafter = w4a8(noisy_head_copy(gemma(architecture, 1, **WIDE)), kernel)
    assert lean.attach_lean(target, kernel.LeanLayers) == "" and lean.attach_lean(drafter, kernel.LeanLayers) == ""
    assert_greedy_spec_is_target_only(target, drafter, tokenizer, "def reverse(lst):", 4)
    assert getattr(target, model_io.RUNNER).native_loop() is not None
