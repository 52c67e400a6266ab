"""A GGUF loaded for w4a8 keeps no float copy of its weights (loading/gguf/slim.py, gguf/tensors.py, gguf/header.py,
quant/block_embedding.py): the cache holds a slim checkpoint, the model equals the one a full conversion
gives, bit for bit, and a `none` start still makes the full conversion."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from model_files import logits, tiny_qwen2, write_gguf
from safetensors import safe_open
from tiny_models import build_tokenizer

from specchat.config import ModelConfig
from specchat.loading import assets, devices, plan
from specchat.loading.gguf import tensors as gguf_tensors
from specchat.loading.gguf.header import read_tensors
from specchat.loading.models import load_model
from specchat.memory import release_freed_memory
from specchat.quant import q4_block
from specchat.quant.block_embedding import BlockEmbedding
from specchat.quant.q4_block import Q4Block
from specchat.quant.w4a8 import Q4Linear


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    resolve = devices.resolve_device
    monkeypatch.setattr(plan, "resolve_device", lambda device: "cpu" if device == "auto" else resolve(device))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory, tok):
    """A tiny qwen2 GGUF with its embeddings in Q8_0 blocks and its first q_proj in Q5_0 (the rest float32)."""
    stored = {"token_embd.weight": GGMLQuantizationType.Q8_0, "blk.0.attn_q.weight": GGMLQuantizationType.Q5_0}
    return write_gguf(
        tmp_path_factory.mktemp("gguf") / "tiny-q8.gguf", tiny_qwen2(len(tok), seed=7), tok, stored=stored
    )


def w4a8_config(path) -> ModelConfig:
    return ModelConfig(source=str(path), dtype="float32", quantization="w4a8", backend="transformers")


def test_a_w4a8_start_caches_a_slim_checkpoint_without_float_layers(q8_gguf, cache, kernel):
    model, _, facts = load_model(w4a8_config(q8_gguf))
    converted = sorted(d.name for d in (cache / "converted").iterdir())
    assert len(converted) == 1 and converted[0].endswith("-float32-slim")
    with safe_open(str(cache / "converted" / converted[0] / "model.safetensors"), framework="pt") as stored:
        names, metadata = set(stored.keys()), stored.metadata()
    assert not any(name.endswith("_proj.weight") or name == "lm_head.weight" for name in names)
    assert "model.embed_tokens.gguf_blocks" in names and metadata["embedding_kind"] == "Q8_0"
    assert "model.layers.0.self_attn.q_proj.bias" in names and "model.norm.weight" in names
    assert isinstance(model.get_input_embeddings(), BlockEmbedding)
    assert isinstance(model.model.layers[0].self_attn.q_proj, Q4Linear)
    assert facts.params == sum(p.numel() for p in tiny_qwen2(model.config.vocab_size, seed=7).parameters())
    tiles = sum(t.nbytes for layer in model.modules() if isinstance(layer, Q4Linear) for t in layer.tiles.tensors())
    assert facts.memory_bytes >= tiles + model.get_input_embeddings().blocks.nbytes  # the banner counts the 4-bit tiles


def test_the_slim_model_equals_the_one_a_full_conversion_gives(q8_gguf, tok, cache, kernel, monkeypatch):
    slim, tokenizer, _ = load_model(w4a8_config(q8_gguf))
    monkeypatch.setattr(gguf_tensors, "streamable", lambda path: False)  # the former path: a full conversion
    monkeypatch.setenv("SPECCHAT_CACHE", str(cache.parent / "other-cache"))
    full, _, _ = load_model(w4a8_config(q8_gguf))
    assert not isinstance(full.get_input_embeddings(), BlockEmbedding)
    assert torch.equal(logits(slim, tokenizer), logits(full, tokenizer))
    for name, layer in full.named_modules():
        if isinstance(layer, Q4Linear):
            other = slim.get_submodule(name)
            assert all(torch.equal(a, b) for a, b in zip(layer.tiles.tensors(), other.tiles.tensors())), name


def test_a_warm_start_reads_neither_the_gguf_nor_float_weights(q8_gguf, tok, cache, kernel, monkeypatch):
    first, tokenizer, _ = load_model(w4a8_config(q8_gguf))
    monkeypatch.setattr(gguf_tensors.GGUFTensors, "__init__", lambda *a: pytest.fail("read the GGUF's tensors"))
    again, _, _ = load_model(w4a8_config(q8_gguf))
    assert torch.equal(logits(again, tokenizer), logits(first, tokenizer))


def test_a_none_start_makes_the_full_conversion(q8_gguf, cache):
    load_model(ModelConfig(source=str(q8_gguf), dtype="float32", quantization="none"))
    assert [d.name.endswith("-float32") for d in (cache / "converted").iterdir()] == [True]


def test_embedding_rows_from_blocks_equal_the_dequantized_table(q8_gguf):
    raw = next(t for t in GGUFReader(str(q8_gguf)).tensors if t.name == "token_embd.weight")
    table = torch.from_numpy(dequantize(raw.data, raw.tensor_type).astype(np.float32))
    embedding = BlockEmbedding(torch.from_numpy(np.array(raw.data)), "Q8_0", table.shape[1])
    ids = torch.tensor([[0, 5, 5, table.shape[0] - 1], [3, 2, 1, 0]])
    assert torch.equal(embedding(ids), torch.nn.functional.embedding(ids, table))


def test_the_header_reader_finds_what_gguf_py_finds(q8_gguf):
    facts, mine = read_tensors(q8_gguf)
    theirs = GGUFReader(str(q8_gguf)).tensors
    assert facts["general.architecture"] == "qwen2"
    assert [(t.name, t.tensor_type, tuple(int(d) for d in t.shape)) for t in theirs] == [
        (t.name, t.tensor_type, t.shape) for t in mine
    ]
    for a, b in zip(theirs, mine):
        assert np.array_equal(np.asarray(a.data), b.data), a.name


def test_dequantizing_in_row_chunks_equals_the_whole(q8_gguf, monkeypatch, tok):
    from transformers import AutoConfig

    from specchat.loading.gguf.slim import empty_model

    model = empty_model(AutoConfig.from_pretrained(str(q8_gguf.parent), gguf_file=q8_gguf.name))
    whole = gguf_tensors.GGUFTensors(q8_gguf, model).float("model.embed_tokens.weight")
    monkeypatch.setattr(gguf_tensors, "CHUNK_ROWS", 7)
    assert torch.equal(gguf_tensors.GGUFTensors(q8_gguf, model).float("model.embed_tokens.weight"), whole)


def test_quantizing_in_row_chunks_equals_the_whole(monkeypatch):
    weight = torch.randn(37, 256)
    whole = Q4Block.quantize(weight, 6)
    monkeypatch.setattr(q4_block, "QUANTIZE_ROWS", 8)
    chunked = Q4Block.quantize(weight, 6)
    assert all(torch.equal(a, b) for a, b in zip(whole.tensors(), chunked.tensors()))


def test_freed_memory_goes_back_on_linux():
    assert release_freed_memory() is True


def test_the_slim_conversion_is_recorded_as_such(q8_gguf, cache, kernel):
    load_model(w4a8_config(q8_gguf))
    meta = json.loads(next((cache / "converted").iterdir()).joinpath("specchat.json").read_text())
    assert meta["slim"] is True and "model.safetensors" in meta["files"]


def fake_bundled(path, tmp_path, monkeypatch) -> assets.BundledModel:
    """`bundled:tiny-q8` made of three parts of the GGUF at `path`."""
    import hashlib

    from specchat.loading import assets

    data = path.read_bytes()
    parts = []
    for index, chunk in enumerate((data[:1000], data[1000:5000], data[5000:]), start=1):
        parts.append(tmp_path / f"part{index:02d}.bin")
        parts[-1].write_bytes(chunk)
    fake = assets.BundledModel("Tiny-Q8-Bundled", "fake-part", "0", 3, len(data), hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(assets.BUNDLED, "tiny-q8", fake)
    monkeypatch.setattr(assets, "find_parts", lambda model: parts)
    return fake


def test_a_bundled_w4a8_start_drops_the_assembled_gguf_and_later_starts_need_none(
    q8_gguf, cache, kernel, monkeypatch, tmp_path
):
    from specchat.loading import assets

    fake = fake_bundled(q8_gguf, tmp_path, monkeypatch)
    first, tokenizer, _ = load_model(w4a8_config("bundled:tiny-q8"))
    assert not (cache / "gguf" / fake.filename).exists()
    parts = assets.find_parts(fake)
    monkeypatch.setattr(assets, "find_parts", lambda model: pytest.fail("assembled again"))
    again, _, _ = load_model(w4a8_config("bundled:tiny-q8"))
    assert torch.equal(logits(again, tokenizer), logits(first, tokenizer))
    monkeypatch.setattr(assets, "find_parts", lambda model: parts)  # a full conversion assembles it again
    load_model(ModelConfig(source="bundled:tiny-q8", dtype="float32", quantization="none"))
    assert (cache / "gguf" / fake.filename).exists()


def test_a_damaged_slim_checkpoint_is_rebuilt_with_one_notice(q8_gguf, cache, kernel):
    first, tokenizer, _ = load_model(w4a8_config(q8_gguf))
    weights = next((cache / "converted").iterdir()) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    seen = []
    again, _, _ = load_model(w4a8_config(q8_gguf), progress=lambda message, fraction: seen.append(message))
    assert sum(message.startswith("rebuilding the converted checkpoint") for message in set(seen)) == 1
    assert torch.equal(logits(again, tokenizer), logits(first, tokenizer))
