"""loading/resident.py: mapped weights made resident at load, values untouched."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from specchat.loading import resident

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_READ is Linux's")


@linux_only
def test_populate_asks_once_per_storage_and_leaves_mapped_values_alone(tmp_path):
    weights = {"a": torch.randn(1000, 300), "b": torch.arange(70000, dtype=torch.float32)}
    save_file(weights, tmp_path / "w.safetensors")
    mapped = load_file(tmp_path / "w.safetensors")  # memory-mapped by safetensors
    views = [mapped["a"], mapped["a"][10:20], mapped["b"]]
    assert resident.populate(views) == 2  # the slice shares a's storage
    assert torch.equal(mapped["a"], weights["a"]) and torch.equal(mapped["b"], weights["b"])


def test_populate_does_nothing_where_madvise_is_missing(monkeypatch):
    monkeypatch.setattr(resident, "_madvise", lambda: None)
    assert resident.populate([torch.ones(4)]) == 0


def test_model_tensors_include_the_w4a8_blocks(tokenizer, kernel):
    from tiny_models import build_model

    from specchat.quant.w4a8 import Q4Linear, quantize_w4a8

    model = build_model(len(tokenizer), seed=0, layers=1, hidden=128)
    quantize_w4a8(model, None, kernel)
    tensors = {tensor.data_ptr() for tensor in resident.model_tensors(model)}
    blocks = [module.tiles for module in model.modules() if isinstance(module, Q4Linear)]
    assert blocks and all(block.qs.data_ptr() in tensors and block.d.data_ptr() in tensors for block in blocks)
    assert model.get_input_embeddings().weight.data_ptr() in tensors


def test_loading_a_model_populates_its_tensors(tokenizer, tmp_path, monkeypatch):
    from tiny_models import build_model

    from specchat.config import ModelConfig
    from specchat.loading import models

    path = tmp_path / "tiny"
    build_model(len(tokenizer), seed=3, layers=1, hidden=128).save_pretrained(path)
    tokenizer.save_pretrained(path)
    asked = []
    monkeypatch.setattr(models, "populate", lambda tensors: asked.append(len(list(tensors))))
    models.load_model(ModelConfig(source=str(path), dtype="float32"))
    assert asked and asked[0] > 0


def test_an_embedding_table_in_blocks_is_not_read_whole(tokenizer):
    """A chat reads a few hundred of the table's rows: it stays mapped, the rest of it on disk."""
    from tiny_models import build_model

    from specchat.quant.block_embedding import BlockEmbedding

    model = build_model(len(tokenizer), seed=0, layers=1, hidden=128)
    model.set_input_embeddings(BlockEmbedding(torch.zeros(len(tokenizer), 34 * 4, dtype=torch.uint8), "Q8_0", 128))
    tensors = resident.model_tensors(model)
    whole = resident.read_whole(model, tensors)
    table = model.get_input_embeddings().blocks
    assert any(t is table for t in tensors) and not any(t is table for t in whole)
    assert len(whole) == len(tensors) - 1
