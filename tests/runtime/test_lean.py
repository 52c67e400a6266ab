"""The lean forward: the same logits and tokens as transformers' forward, a static cache that rolls
back and grows, batch invariance kept with a w8a8 model, and a fallback for other architectures."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import CheapDrafterGamma, hf_greedy, make_engine, prompt_ids, run_reply
from tiny_models import build_model
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from specchat.config import AUTO, SamplingConfig
from specchat.quant.w8a8 import quantize_w8a8
from specchat.runtime import lean
from specchat.runtime.attention import use_batch_invariant_attention
from specchat.runtime.lean import LeanKVCache
from specchat.speculative import model_io

TEXT = "def reverse(lst):\n    return lst[::-1]\n" * 4


def lean_copy(model):
    copied = copy.deepcopy(model)
    assert lean.attach_lean(copied) == ""
    return copied


@torch.inference_mode()
def logits_in_pieces(model, ids: list[int], prefix: int, pieces: list[int], crop_first: int = 0):
    """Logits of ids[prefix:] fed in pieces after the prefix, through model_io (lean or not); with
    crop_first, `crop_first` tokens are fed and cropped back to the prefix first (a rejected draft)."""
    cache = model_io.new_kv_cache(model)
    model_io.forward(model, cache, ids[:prefix], keep=1)
    if crop_first:
        model_io.forward(model, cache, ids[prefix : prefix + crop_first][::-1], keep=1)
        model_io.crop_to(cache, prefix)
    out, start = [], prefix
    for size in pieces:
        out.append(model_io.forward(model, cache, ids[start : start + size], keep=size))
        start += size
    return torch.cat(out)


def test_lean_logits_match_transformers_in_float32(target, tokenizer):
    ids = prompt_ids(tokenizer, TEXT)
    model = lean_copy(target)
    for pieces, crop in (([1] * 9, 0), ([9], 0), ([2, 3, 4], 5)):
        ours = logits_in_pieces(model, ids, 20, pieces, crop)
        theirs = logits_in_pieces(target, ids, 20, pieces, crop)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_the_lean_cache_is_static_and_rolls_back_by_moving_a_length(target, tokenizer):
    model = lean_copy(target)
    cache = model_io.new_kv_cache(model)
    assert isinstance(cache, LeanKVCache) and not isinstance(target_cache := model_io.new_kv_cache(target), LeanKVCache)
    assert isinstance(target_cache, model_io.TransformersKVCache)
    model_io.forward(model, cache, prompt_ids(tokenizer, TEXT)[:30], keep=1)
    keys = cache.keys[0]
    model_io.crop_to(cache, 12)
    assert model_io.kv_length(cache) == 12 and cache.keys[0] is keys  # no copy, no reallocation
    with pytest.raises(ValueError):
        model_io.crop_to(cache, 13)


def test_a_long_prompt_fed_in_pieces_gives_the_same_logits(target, tokenizer, monkeypatch):
    ids = prompt_ids(tokenizer, TEXT)
    model = lean_copy(target)
    whole = logits_in_pieces(model, ids, 3, [27])
    monkeypatch.setattr(model_io, "PREFILL_CHUNK", 4)  # 27 tokens: 7 pieces, the last one 3 tokens long
    pieces = logits_in_pieces(model, ids, 3, [27])
    assert pieces.shape == whole.shape == (27, target.config.vocab_size)
    assert torch.allclose(pieces, whole, atol=1e-4, rtol=0)


def test_the_causal_mask_covers_only_the_rows_fed(target):
    forward = getattr(lean_copy(target), model_io.RUNNER)
    assert forward._causal_mask(start=500, fed=1) is None
    mask = forward._causal_mask(start=10, fed=3)[0, 0]  # [3, 13], not [capacity, capacity]
    assert mask.shape == (3, 13)
    assert [int((row == 0).sum()) for row in mask] == [11, 12, 13]  # row i sees keys 0 … 10+i


def test_the_lean_cache_grows_past_its_first_capacity(target, tokenizer, monkeypatch):
    monkeypatch.setattr(lean, "FIRST_CAPACITY", 8)
    ids = prompt_ids(tokenizer, TEXT)
    model = lean_copy(target)
    ours = logits_in_pieces(model, ids, 5, [3, 1, 6, 9, 1])
    assert torch.allclose(ours, logits_in_pieces(target, ids, 5, [3, 1, 6, 9, 1]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("gamma", [1, 4, 8, AUTO])
def test_greedy_speculative_on_lean_models_equals_transformers_generate(
    target, similar_drafter_model, tokenizer, gamma
):
    ids = prompt_ids(tokenizer, "The quick brown")
    engine = make_engine(lean_copy(target), lean_copy(similar_drafter_model), tokenizer, policy=CheapDrafterGamma())
    _, done = run_reply(engine, ids, gamma=gamma)
    assert list(done.ids) == hf_greedy(target, ids, 40)
    assert done.stats.drafted > 0 and done.stats.acceptance_rate < 0.95


def test_a_lean_multi_turn_reply_reuses_the_cache_and_stays_exact(target, similar_drafter_model, tokenizer):
    engine = make_engine(lean_copy(target), lean_copy(similar_drafter_model), tokenizer)
    history = prompt_ids(tokenizer, "Hello, how are you")
    for turn in ("for i in range(10):", "The quick brown"):
        _, done = run_reply(engine, history, gamma=4)
        assert list(done.ids) == hf_greedy(target, history, 40)
        history = history + list(done.ids) + prompt_ids(tokenizer, turn)
    assert done.stats.reused_tokens > 0


def test_sampled_replies_are_the_same_with_either_forward(target, similar_drafter_model, tokenizer):
    sampling = SamplingConfig(temperature=0.8, top_p=0.95, seed=3, max_new_tokens=30)
    ids = prompt_ids(tokenizer, "for i in range(10):")
    replies = [
        run_reply(make_engine(t, d, tokenizer), ids, sampling, gamma=3)[1].ids
        for t, d in ((target, similar_drafter_model), (lean_copy(target), lean_copy(similar_drafter_model)))
    ]
    assert replies[0] == replies[1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_lean_w8a8_model_scores_a_row_the_same_alone_in_a_batch_or_after_a_crop(tokenizer, dtype):
    model = copy.deepcopy(build_model(len(tokenizer), seed=1, layers=2, hidden=256))
    quantize_w8a8(model)
    use_batch_invariant_attention(model)
    model = lean_copy(model.to(dtype))
    ids = torch.randint(0, len(tokenizer), (40,), generator=torch.Generator().manual_seed(3)).tolist()
    one_by_one = logits_in_pieces(model, ids, 31, [1] * 9)
    for pieces, crop in (([9], 0), ([5, 4], 0), ([2, 3, 4], 0), ([9], 6)):
        assert torch.equal(one_by_one, logits_in_pieces(model, ids, 31, pieces, crop))


def test_a_qwen2_model_runs_lean_with_its_attention_biases():
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # random init leaves the q/k/v biases at zero
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    ours = logits_in_pieces(lean_copy(model), ids, 20, [1, 4, 5])
    assert torch.allclose(ours, logits_in_pieces(model, ids, 20, [1, 4, 5]), atol=1e-4, rtol=0)


def test_other_architectures_keep_the_transformers_forward():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2)).eval()
    reason = lean.attach_lean(model)
    assert "GPT2LMHeadModel" in reason and not hasattr(model, model_io.RUNNER)
    assert isinstance(model_io.new_kv_cache(model), model_io.TransformersKVCache)
