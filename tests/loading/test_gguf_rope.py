"""Llama-3.1+ GGUF files hold their rope scaling as divisors (rope_freqs.weight), which transformers' reader
ignores: loading/gguf/config.py makes them rope_type "llama3" in the config, so the model rotates as llama.cpp
and the original model do; divisors no Llama-3 scaling gives are one notice line."""

from __future__ import annotations

import numpy as np
import torch
from model_files import tiny_model, vocab_size, write_gguf
from test_gguf_architectures import cache, on_the_cpu
from tiny_models import build_tokenizer
from transformers import LlamaForCausalLM

from specchat.loading.gguf.config import file_config, llama3_divisors, llama3_scaling
from specchat.loading.models import load_model
from specchat.settings import load_config

HEAD = 16  # 8 frequencies; with base 10000 and an original context of 2048, every band of the scaling has some
SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 2048,
}


FIXTURES = (cache, on_the_cpu)  # test_gguf_architectures' autouse fixtures, on here too


def divisors(factor: float = 8.0, context: int = 2048) -> np.ndarray:
    return llama3_divisors(10000.0, HEAD, factor, 1.0, 4.0, context)


def test_every_band_is_exercised_and_the_parameters_come_back():
    found = divisors()
    assert found[0] == 1.0 and found[-1] == 8.0 and ((found > 1) & (found < 8)).any()
    assert llama3_scaling(found, 10000.0, HEAD) == SCALING
    assert llama3_scaling(divisors(32.0, 8192), 10000.0, HEAD)["factor"] == 32.0  # Llama-3.2's
    assert llama3_scaling(found[::-1].copy(), 10000.0, HEAD) is None
    assert llama3_scaling(found[:-1], 10000.0, HEAD) is None  # one divisor per frequency, or none fits


def test_a_llama3_file_loads_rotating_as_the_original_model(tmp_path):
    tok = build_tokenizer()
    original = tiny_model("llama", vocab_size(tok, "llama"), seed=3, head_dim=HEAD, max_position_embeddings=4096)
    path = write_gguf(
        tmp_path / "l3.gguf", original, tok, architecture="llama", extra_tensors={"rope_freqs.weight": divisors()}
    )
    assert file_config(path).rope_parameters == {"rope_theta": 10000.0, **SCALING}
    scaled_config = original.config
    scaled_config.rope_parameters = {"rope_theta": 10000.0, **SCALING}
    scaled = LlamaForCausalLM(scaled_config).eval()
    scaled.load_state_dict(original.state_dict())
    loaded = load_model(
        load_config(None, [f"target.source={path}", "target.quantization=none", "target.dtype=float32"]).target
    )
    ids = torch.tensor([list(range(3, 303))])  # 300 positions: the long wavelengths turn far enough to tell
    with torch.inference_mode():
        got, want, plain = (m(ids).logits for m in (loaded[0], scaled, original))
    error, unscaled = (got - want).abs().max().item(), (plain - want).abs().max().item()
    assert error < 1e-5 and unscaled > 30 * error  # the test tells a file loaded without its scaling


def test_divisors_no_llama3_scaling_gives_are_one_notice(tmp_path):
    tok = build_tokenizer()
    model = tiny_model("llama", vocab_size(tok, "llama"), seed=3, head_dim=HEAD, max_position_embeddings=4096)
    odd = np.linspace(1.0, 3.0, HEAD // 2, dtype=np.float32)
    path = write_gguf(tmp_path / "odd.gguf", model, tok, architecture="llama", extra_tensors={"rope_freqs.weight": odd})
    notices = []
    config = file_config(path, lambda message, fraction: notices.append(message))
    assert config.rope_parameters.get("rope_type", "default") == "default"
    assert notices == [
        "odd.gguf: its rope_freqs are not Llama-3's rope scaling; the model rotates without them "
        "(its answers will differ from llama.cpp's)"
    ]


def test_a_llama3_file_loads_with_the_default_config(tmp_path, kernel):
    tok = build_tokenizer()
    model = tiny_model("llama", vocab_size(tok, "llama"), seed=3, head_dim=HEAD, max_position_embeddings=4096)
    extra = {"rope_freqs.weight": divisors()}
    path = write_gguf(tmp_path / "l3.gguf", model, tok, architecture="llama", extra_tensors=extra)
    loaded, _, facts = load_model(load_config(None, [f"target.source={path}"]).target)
    assert facts.backend == "lean (compiled layers)" and loaded.config.rope_parameters["rope_type"] == "llama3"
