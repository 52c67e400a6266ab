"""The architectures users' own GGUF files have, each written small by the gguf package's writer (random
weights, the tiny tokenizer) and loaded as a user loads them: tied output heads (Llama-3.2, small Qwen2/Qwen3
files), Qwen3's q/k norms and head size, and the architectures the lean forward leaves to transformers."""
from __future__ import annotations

import pytest
import torch

from model_files import greedy_reply, logits, tiny_model, write_gguf
from tiny_models import build_tokenizer
from specchat.config import load_config
from specchat.loading import devices
from specchat.loading import models as model_loading
from specchat.loading.models import load_pair


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    resolve = devices.resolve_device
    monkeypatch.setattr(model_loading, "resolve_device", lambda device: "cpu" if device == "auto" else resolve(device))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def gguf_pair(folder, tok, architecture: str, tied: bool, **shape):
    """(target file, its model, drafter file) of one architecture."""
    target = tiny_model(architecture, len(tok), seed=1, tied=tied, **shape)
    drafter = tiny_model(architecture, len(tok), seed=2, tied=tied, **shape)
    return (write_gguf(folder / "target.gguf", target, tok, architecture=architecture), target,
            write_gguf(folder / "drafter.gguf", drafter, tok, architecture=architecture))


def default_pair(target, drafter, *overrides: str):
    """load_pair with the default config (w4a8 target, w4a8-fast drafter, the lean forward), on these files."""
    return load_pair(load_config(None, [f"target.source={target}", f"drafter.source={drafter}", *overrides]))


def prompt_ids(tok) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": "def reverse(lst):"}], tokenize=False,
                                   add_generation_prompt=True)
    return tok.encode(text)


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_tied_file_loads_with_the_default_config_on_the_compiled_layers_and_stays_exact(tmp_path, tok, kernel,
                                                                                         architecture):
    target, _, drafter = gguf_pair(tmp_path, tok, architecture, tied=True)
    pair = default_pair(target, drafter)
    assert pair.target_facts.backend == "lean (compiled layers)" == pair.drafter_facts.backend
    assert pair.target_facts.quantization == "ALL_F32→w4a8"
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_tied_file_unquantized_is_the_model_it_was_written_from(tmp_path, tok, architecture):
    target, original, drafter = gguf_pair(tmp_path, tok, architecture, tied=True)
    pair = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    model = pair.target
    assert model.config.tie_word_embeddings
    assert torch.equal(model.get_output_embeddings().weight, original.get_input_embeddings().weight)
    assert torch.allclose(logits(model, pair.tokenizer), logits(original, tok), atol=1e-5, rtol=0)
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)


def test_a_tied_w4a8_head_is_the_file_embeddings_quantized(tmp_path, tok, kernel):
    """The w4a8 head of a tied file is read from token_embd: its logits follow the float model's."""
    target, original, drafter = gguf_pair(tmp_path, tok, "llama", tied=True)
    pair = default_pair(target, drafter)
    ids = torch.tensor([prompt_ids(tok)])
    with torch.inference_mode():
        quantized = pair.target(ids).logits[0]
        wanted = original(ids).logits[0]
    assert (quantized.argmax(-1) == wanted.argmax(-1)).float().mean() >= 0.9
    assert (quantized - wanted).abs().max() < 0.1 * wanted.abs().max()
