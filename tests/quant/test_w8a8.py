"""int8×int8 (w8a8) targets: bitwise batch invariance, greedy exactness in bf16, the stored weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import assert_greedy_spec_is_target_only, assert_multi_turn_exact, noisy_head_copy
from tiny_models import build_model
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from specchat.config import AUTO
from specchat.loading import stored_weights
from specchat.quant import shared, w8a8
from specchat.quant.int8_weights import Int8Block, Int8Linear
from specchat.quant.w8a8 import W8A8Linear, quantize_w8a8
from specchat.runtime.attention import use_batch_invariant_attention


def w8a8_model(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    quantized = copy.deepcopy(model)
    quantize_w8a8(quantized)
    use_batch_invariant_attention(quantized)
    return quantized.to(dtype)


@torch.inference_mode()
def logits_in_pieces(model, ids: list[int], prefix: int, pieces: list[int], crop_first: int = 0):
    """Logits of ids[prefix:], fed after the prefix in pieces of the given sizes (optionally after
    feeding and cropping `crop_first` other tokens, as a rejected draft leaves the cache)."""
    cache = DynamicCache()
    model(input_ids=torch.tensor([ids[:prefix]]), past_key_values=cache, use_cache=True)
    if crop_first:
        model(input_ids=torch.tensor([ids[:crop_first]]), past_key_values=cache, use_cache=True)
        cache.crop(prefix - cache.get_seq_length())  # a negative count: the tokens dropped
    out, start = [], prefix
    for size in pieces:
        piece = torch.tensor([ids[start : start + size]])
        out.append(model(input_ids=piece, past_key_values=cache, use_cache=True).logits[0])
        start += size
    return torch.cat(out)


def feeding_orders_agree(model, vocab: int) -> bool:
    ids = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    one_by_one = logits_in_pieces(model, ids, 31, [1] * 9)
    return all(
        torch.equal(one_by_one, logits_in_pieces(model, ids, 31, pieces, crop))
        for pieces, crop in (([9], 0), ([5, 4], 0), ([2, 3, 4], 0), ([9], 6))
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [64, 256])
def test_a_w8a8_model_scores_a_row_the_same_alone_in_a_batch_or_after_a_crop(tokenizer, dtype, hidden):
    model = w8a8_model(build_model(len(tokenizer), seed=1, layers=2, hidden=hidden), dtype)
    assert feeding_orders_agree(model, len(tokenizer))


def test_one_decoder_layer_of_the_bundled_targets_shape_is_batch_invariant():
    """Qwen2.5-Coder-1.5B's layer shapes (1536 wide, 8960 MLP, 12 heads over 2 KV heads), random weights."""
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=1,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = w8a8_model(Qwen2ForCausalLM(config).eval(), torch.bfloat16)
    assert feeding_orders_agree(model, 512)


@pytest.mark.parametrize("passes", [1, 2])
def test_a_w8a8_linear_is_batch_invariant_and_close_to_the_float_product(passes):
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(384, 256, generator=generator), torch.randn(384, generator=generator)
    layer = W8A8Linear.from_weight(weight, bias, passes)
    x = torch.randn(9, 256, generator=generator) * torch.logspace(-2, 1, 256)  # heavy-tailed channels
    together = layer(x)
    assert all(torch.equal(layer(x[i : i + 1])[0], together[i]) for i in range(9))
    exact = torch.nn.functional.linear(x, weight, bias)
    relative = ((together - exact).norm() / exact.norm()).item()
    from specchat.quant.w8a8 import _REDUCE_RANGE  # 7-bit activations without VNNI: twice the step

    assert relative < (0.02 if passes == 1 else 0.01) * (2 if _REDUCE_RANGE else 1)


@pytest.mark.parametrize("passes", [1, 2])
def test_layers_reading_one_input_share_its_mapping_bitwise(passes):
    from specchat.quant.w8a8 import same_input

    generator = torch.Generator().manual_seed(4)
    layers = [
        W8A8Linear.from_weight(torch.randn(out, 96, generator=generator), torch.randn(out, generator=generator), passes)
        for out in (96, 32, 32)
    ]
    x = torch.randn(1, 5, 96, generator=generator)
    assert all(torch.equal(shared, layer(x)) for shared, layer in zip(same_input(layers, x), layers))
    mixed = [layers[0], torch.nn.Linear(96, 8)]  # not all w8a8: each layer on its own
    assert torch.equal(same_input(mixed, x)[1], mixed[1](x))


def test_both_passes_in_one_kernel_call_equal_one_call_per_pass_bitwise():
    """The passes share a kernel call (the weights are read once); the reference calls the kernel once
    per pass, each with its own +1/−1 rows, and undoes each pass's map by hand."""
    from specchat.quant.w8a8 import _bounds, _int8_product, map_rows

    generator = torch.Generator().manual_seed(7)
    layer = W8A8Linear.from_weight(torch.randn(200, 128, generator=generator), None, passes=2)
    x = torch.randn(5, 128, generator=generator) * torch.logspace(-2, 2, 128)
    mapped = map_rows(x, 2)
    assert mapped.rows.shape == (12, 128) and mapped.passes == 2
    reference = None
    for index in range(2):
        rows = torch.cat([mapped.rows[index * 5 : (index + 1) * 5], _bounds(128)])
        product = _int8_product(rows, layer._product._packs[0])[:-2]
        part = torch.addcmul(mapped.centres[index] * layer.block.row_sums, product, mapped.scales[index])
        reference = part if reference is None else reference + part
    assert torch.equal(layer(x), reference)


@pytest.mark.parametrize("lean", [True, False])
def test_layers_packed_as_one_matrix_give_bitwise_the_logits_of_layers_packed_apart(monkeypatch, lean):
    """q/k/v and gate/up packed together (one kernel call each) against every layer packed alone, on a
    Qwen2 model (attention biases), through the lean forward and through transformers' modules."""
    from specchat.runtime import lean
    from specchat.speculative import model_io

    config = Qwen2Config(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(2)
    model = Qwen2ForCausalLM(config).eval()
    packed_together = w8a8_model(model, torch.float32)
    monkeypatch.setattr(shared, "SHARED_INPUTS", ())
    packed_apart = w8a8_model(model, torch.float32)
    layer = packed_together.model.layers[0]
    assert layer.self_attn.k_proj.group is layer.self_attn.q_proj.group is not None
    assert layer.mlp.up_proj.group is layer.mlp.gate_proj.group is not None
    assert packed_apart.model.layers[0].self_attn.q_proj.group is None
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = []
    for model in (packed_together, packed_apart):
        if lean:
            assert lean.attach_lean(model) == ""
        cache = model_io.new_kv_cache(model)
        logits.append(
            torch.cat(
                [
                    model_io.forward_tensor(model, cache, ids[:, :9], keep=9),
                    model_io.forward_tensor(model, cache, ids[:, 9:], keep=3),
                ]
            )
        )
    assert torch.equal(logits[0], logits[1])


def test_a_packed_layer_called_alone_takes_its_part_and_the_parts_are_let_go():
    from specchat.quant.w8a8 import same_input

    layers = torch.nn.ModuleDict(
        {"q_proj": torch.nn.Linear(64, 64), "k_proj": torch.nn.Linear(64, 16), "v_proj": torch.nn.Linear(64, 16)}
    )
    quantize_w8a8(layers)
    q, k, v = layers["q_proj"], layers["k_proj"], layers["v_proj"]
    group = q.group
    x = torch.randn(1, 3, 64)
    together = same_input([q, k, v], x)
    assert [t.shape for t in together] == [(1, 3, 64), (1, 3, 16), (1, 3, 16)]
    assert torch.equal(v(x), together[2]) and group._parts  # the others' parts wait for them
    assert torch.equal(q(x), together[0]) and torch.equal(k(x), together[1])
    assert group._parts == [] and group._input is None
    other = torch.randn(1, 3, 64)
    assert torch.equal(q(other), same_input([q, k, v], other)[0])  # a new input is computed afresh


def test_two_activation_passes_are_more_accurate_on_heavy_tailed_rows():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(256, 512, generator=generator)
    x = torch.randn(4, 512, generator=generator)
    x[:, :4] *= 300  # a few channels far above the rest, as at the MLP's output projection
    exact = x @ weight.T
    errors = [(W8A8Linear.from_weight(weight, None, p)(x) - exact).norm() / exact.norm() for p in (1, 2)]
    assert errors[1] < errors[0] / 3


@pytest.fixture(scope="module")
def bf16_pair(tokenizer):
    target = build_model(len(tokenizer), seed=1, layers=3, hidden=256)
    return w8a8_model(target, torch.bfloat16), noisy_head_copy(target).to(torch.bfloat16)


def bf16_cases() -> list:
    """Both prompts × every gamma (8 cases). The fast default runs 4: every gamma once, the prompts taking
    turns; the rest are slow."""
    texts = ["def reverse(lst):", "The quick brown"]
    return [
        pytest.param(text, gamma, marks=() if g % len(texts) == t else pytest.mark.slow)
        for t, text in enumerate(texts)
        for g, gamma in enumerate([1, 4, 8, AUTO])
    ]


@pytest.mark.parametrize("text, gamma", bf16_cases())
def test_greedy_speculative_equals_target_only_with_a_w8a8_target_in_bf16(bf16_pair, tokenizer, gamma, text):
    assert_greedy_spec_is_target_only(*bf16_pair, tokenizer, text, gamma)


def test_a_multi_turn_w8a8_reply_stays_exact_when_the_cache_is_reused(bf16_pair, tokenizer):
    assert_multi_turn_exact(*bf16_pair, tokenizer)


def test_the_stored_weights_round_trip_and_a_damaged_file_is_rebuilt(tmp_path, tokenizer, monkeypatch):
    model = build_model(len(tokenizer), seed=1, layers=2, hidden=64)
    path = tmp_path / "model-bfloat16-w8a8.safetensors"
    first = copy.deepcopy(model)
    assert stored_weights.load_or_quantize(first, path, "tiny", "w8a8") is None and path.exists()
    with monkeypatch.context() as patch:  # the second start must not quantize at all
        patch.setattr(Int8Block, "quantize", lambda weight: pytest.fail("quantized again"))
        again = copy.deepcopy(model)
        assert stored_weights.load_or_quantize(again, path, "tiny") is None
    x = torch.randn(3, 128)
    assert torch.equal(first.model.layers[0].mlp.down_proj(x), again.model.layers[0].mlp.down_proj(x))
    path.write_bytes(path.read_bytes()[:1000])  # a killed write
    notice = stored_weights.load_or_quantize(copy.deepcopy(model), path, "tiny")
    assert notice and "rebuilt" in notice and path.stat().st_size > 1000
    assert json.loads(path.with_name(path.name + ".json").read_text())["size"] == path.stat().st_size


def test_stored_weights_read_back_are_aligned_for_the_int8_kernel(tmp_path, tokenizer):
    """safetensors maps the file; a tensor there starts wherever the header ends, and torch's int8
    kernel crashed (SIGSEGV) on such weights for 8 rows and more."""
    path = tmp_path / "int8.safetensors"
    stored_weights.load_or_quantize(build_model(len(tokenizer), seed=1, layers=2), path, "tiny", "int8")
    blocks, _ = stored_weights._read(path, None)
    assert blocks and all(t.data_ptr() % 64 == 0 for b in blocks.values() for t in (b.weight, b.scale, b.row_sums))
    again = build_model(len(tokenizer), seed=1, layers=2)
    stored_weights.load_or_quantize(again, path, "tiny", "int8")
    assert again(torch.tensor([list(range(3, 40))])).logits.isfinite().all()


def test_stored_weights_of_another_model_are_rebuilt(tmp_path, tokenizer):
    path = tmp_path / "w8a8.safetensors"
    stored_weights.load_or_quantize(build_model(len(tokenizer), seed=1, layers=2), path, "tiny")
    notice = stored_weights.load_or_quantize(build_model(len(tokenizer), seed=1, layers=3), path, "tiny")
    assert notice and "another model" in notice


def test_int8_blocks_keep_row_sums_and_leave_the_float_weight_alone():
    weight = torch.randn(8, 16)
    original = weight.clone()
    block = Int8Block.quantize(weight)
    assert torch.equal(weight, original)  # a tied head shares this tensor with the embeddings
    assert torch.allclose(block.row_sums, (block.weight.float() * block.scale[:, None]).sum(1), atol=1e-5)


def test_a_layer_packed_in_row_pieces_computes_the_same_as_one_piece(monkeypatch):
    block = Int8Block.quantize(torch.randn(300, 64))
    whole = W8A8Linear(block, None)
    monkeypatch.setattr(w8a8, "PACK_ROWS", 128)
    pieces = W8A8Linear(block, None)
    assert len(pieces._product._packs) == 3
    x = torch.randn(5, 64)
    assert torch.equal(whole(x), pieces(x))


def test_weight_only_int8_weights_are_stored_too(tmp_path, tokenizer, monkeypatch):
    model = build_model(len(tokenizer), seed=1, layers=2, hidden=64)
    path = tmp_path / "int8.safetensors"
    first = copy.deepcopy(model)
    stored_weights.load_or_quantize(first, path, "tiny", "int8")
    monkeypatch.setattr(Int8Block, "quantize", lambda weight: pytest.fail("quantized again"))
    again = copy.deepcopy(model)
    stored_weights.load_or_quantize(again, path, "tiny", "int8")
    assert isinstance(again.lm_head, Int8Linear)
    x = torch.randn(2, 64)
    assert torch.equal(first.lm_head(x), again.lm_head(x))


def test_w8a8_fast_reads_the_same_weights_file_as_w8a8():
    """Both modes quantize the weights the same way; only the activation passes differ."""
    assert stored_weights.stored_weights_path("ab" * 16, "float32", "w8a8-fast") == stored_weights.stored_weights_path(
        "ab" * 16, "float32", "w8a8"
    )
    assert stored_weights.stored_weights_path("ab" * 16, "float32", "int8") != stored_weights.stored_weights_path(
        "ab" * 16, "float32", "w8a8"
    )
