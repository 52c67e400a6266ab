"""The architectures users' own GGUF files have, each written small by the gguf package's writer (random
weights, the tiny tokenizer) and loaded as a user loads them: tied output heads (Llama-3.2, small Qwen2/Qwen3
files), Qwen3's q/k norms and head size, and the architectures the lean forward leaves to transformers."""

from __future__ import annotations

import pytest
import torch
from model_files import greedy_reply, logits, tiny_model, vocab_size, write_gguf
from tiny_models import build_tokenizer

from specchat.errors import ModelLoadError
from specchat.loading import devices, plan
from specchat.loading.gguf.config import file_config, set_head_size
from specchat.loading.models import load_pair
from specchat.runtime import architectures
from specchat.settings import load_config


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    resolve = devices.resolve_device
    monkeypatch.setattr(plan, "resolve_device", lambda device: "cpu" if device == "auto" else resolve(device))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def gguf_pair(folder, tok, architecture: str, tied: bool, **shape):
    """(target file, its model, drafter file) of one architecture."""
    target = tiny_model(architecture, vocab_size(tok, architecture), seed=1, tied=tied, **shape)
    drafter = tiny_model(architecture, vocab_size(tok, architecture), seed=2, tied=tied, **shape)
    return (
        write_gguf(folder / "target.gguf", target, tok, architecture=architecture),
        target,
        write_gguf(folder / "drafter.gguf", drafter, tok, architecture=architecture),
    )


def default_pair(target, drafter, *overrides: str, progress=None):
    """load_pair with the default config (w4a8 target, w4a8-fast drafter, the lean forward), on these files."""
    return load_pair(load_config(None, [f"target.source={target}", f"drafter.source={drafter}", *overrides]), progress)


def prompt_ids(tok) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": "def reverse(lst):"}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(text)


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_tied_file_loads_with_the_default_config_on_the_compiled_layers_and_stays_exact(
    tmp_path, tok, kernel, architecture
):
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


@pytest.mark.parametrize("architecture, tied, need", [("gemma2", True, "soft-capping")])
def test_an_architecture_the_lean_forward_lacks_runs_on_transformers_with_one_notice_line(
    tmp_path, tok, kernel, recwarn, monkeypatch, architecture, tied, need
):
    """Loaded with the default config: one line a model names the slower path and why; no FutureWarning from
    transformers' forward (its past_key_values renamed) while the reply runs; still exact. Every architecture in the
    table runs lean, so the lean forward is made to lack Gemma-2's soft-capping here."""
    monkeypatch.setattr(architectures, "LEAN_RUNS", architectures.LEAN_RUNS - {"soft_capping"})
    target, _, drafter = gguf_pair(tmp_path, tok, architecture, tied=tied)
    lines = []
    pair = default_pair(target, drafter, progress=lambda message, fraction: lines.append(message))
    slower = [line for line in lines if "transformers' forward" in line]
    assert sorted(line.split(" runs on ")[0] for line in slower) == ["drafter drafter", "target target"]
    assert all(need in line and "\n" not in line for line in slower)
    assert pair.target_facts.backend.startswith("transformers (") and need in pair.target_facts.backend
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)], [str(w.message) for w in recwarn]


def test_a_qwen3_file_with_its_own_head_size_loads_and_stays_exact(tmp_path, tok, kernel):
    """Qwen3: q/k norms per head, a head size (32) other than hidden ÷ heads (16), a tied head."""
    target, original, drafter = gguf_pair(tmp_path, tok, "qwen3", tied=True, head_dim=32)
    pair = default_pair(target, drafter)
    assert pair.target.config.head_dim == 32 and pair.target_facts.backend == "lean (compiled layers)"
    ids = prompt_ids(tok)
    assert greedy_reply(pair, "spec", ids) == greedy_reply(pair, "target", ids)
    unquantized = default_pair(target, drafter, "target.quantization=none", "target.dtype=float32")
    assert torch.allclose(logits(unquantized.target, tok), logits(original, tok), atol=1e-5, rtol=0)


def test_the_file_config_takes_the_head_size_the_file_states(tmp_path, tok):
    path = write_gguf(tmp_path / "q.gguf", tiny_model("qwen3", len(tok), head_dim=32), tok, architecture="qwen3")
    config = file_config(path)
    assert config.head_dim == 32 and config.num_attention_heads * config.head_dim != config.hidden_size
    with pytest.raises(ModelLoadError, match="states a head size of 3; an even number up to 4096"):
        set_head_size(config, 3, path)
