"""Weight-only int8 layers: close to the float layer, every Linear replaced, embeddings untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import build_model

from specchat.quant.int8_weights import Int8Linear, quantize_linears
from specchat.speculative.drafters.vocab import DraftVocab, head_rows


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_layer_is_close_to_the_float_layer(dtype, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias).to(dtype)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(2, 5, 64, dtype=dtype)  # 3-D input, as inside a model
    with torch.no_grad():
        expected, got = linear(x), layer(x)
    assert got.shape == (2, 5, 48) and got.dtype == dtype
    assert layer.w8.dtype == torch.int8 and layer.w8.shape == (48, 64)
    assert relative_error(got, expected) < 0.02
    assert relative_error(got, expected) > 0  # really quantized, not the float weights


def test_rows_compute_a_subset_of_the_outputs():
    torch.manual_seed(1)
    layer = Int8Linear.from_linear(torch.nn.Linear(16, 10))
    x = torch.randn(3, 16)
    full = layer(x)
    assert torch.equal(layer.rows(slice(0, 4))(x), full[:, :4])
    assert torch.equal(layer.rows(torch.tensor([7, 2]))(x), full[:, [7, 2]])


def test_head_rows_on_a_float_head_matches_the_head():
    head = torch.nn.Linear(8, 12)
    x = torch.randn(1, 8)
    with torch.no_grad():
        assert torch.allclose(head_rows(head, torch.tensor([3, 11]))(x), head(x)[:, [3, 11]])


def test_quantize_linears_replaces_every_linear_and_unties_the_head(tokenizer):
    model = build_model(len(tokenizer), seed=3, layers=2)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight  # tied as a checkpoint with a tied head loads
    embeddings = model.model.embed_tokens.weight.detach().clone()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    ids = torch.tensor([tokenizer.encode("def reverse(lst):")])
    with torch.no_grad():
        before = model(ids).logits
        assert len(quantize_linears(model)) == linears
        after = model(ids).logits
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert torch.equal(model.model.embed_tokens.weight, embeddings)
    assert relative_error(after, before) < 0.05


def test_draft_vocab_over_an_int8_head_scores_the_same_rows(tokenizer):
    model = copy.deepcopy(build_model(len(tokenizer), seed=4, layers=1))
    quantize_linears(model)
    vocab = DraftVocab(model.get_output_embeddings(), limit=100, always_ids={300})
    vocab.update([5, 250])
    hidden = torch.randn(1, 64)
    full = model.lm_head(hidden)
    assert torch.equal(vocab.logits(hidden), full[:, list(range(100)) + [250, 300]])
