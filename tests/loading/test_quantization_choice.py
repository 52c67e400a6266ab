"""The default pair starts on any machine (loading/quantization_choice.py, loading/kernels.py): the
quantization is settled before the slow work, `auto` falls back with one notice where the w4a8 kernel
cannot be built, an explicit w4a8 fails fast naming the key and the build log, layers whose shapes the
kernel cannot take stay unquantized with one notice, and `device = "auto"` picks CUDA, then MPS, then the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import build_tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

from specchat.config import Config, ConfigError, ModelConfig
from specchat.errors import ModelLoadError
from specchat.kernels import build as kernels
from specchat.loading import devices, quantization_choice
from specchat.loading.quantization_choice import choose, choose_quantizations
from specchat.settings import load_config


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """A temporary cache with no built kernel and a compiler that does not exist; afterwards the
    process's kernel is looked up again (it is still built in the real cache)."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    kernels._kernel_or_error.cache_clear()
    yield tmp_path / "cache"
    kernels._kernel_or_error.cache_clear()


def test_auto_takes_w4a8_on_a_cpu_where_the_kernel_builds():
    notices = []
    chosen = choose(
        ModelConfig(source="x", quantization="auto", device="cpu"),
        "target",
        progress=lambda message, fraction: notices.append(message),
    )
    assert chosen.quantization == "w4a8" and not [notice for notice in notices if "using quantization" in notice]
    assert (
        choose(ModelConfig(source="x", quantization="auto-fast", device="cpu"), "drafter").quantization == "w4a8-fast"
    )


def test_auto_falls_back_with_one_notice_where_the_kernel_cannot_be_built(no_compiler):
    notices = []
    cfg = dataclasses.replace(
        Config(),
        target=ModelConfig(source="a", quantization="auto", device="cpu"),
        drafter=ModelConfig(source="b", quantization="auto-fast", device="cpu"),
    )
    chosen = choose_quantizations(cfg, lambda message, fraction: notices.append(message))
    fallback = ("w8a8", "w8a8-fast") if quantization_choice.has_x86_int8() else ("none", "none")
    assert (chosen.target.quantization, chosen.drafter.quantization) == fallback
    assert len(notices) == 2 and notices[0].startswith(f"target: using quantization {fallback[0]}, not w4a8: ")
    assert "no C++ compiler" in notices[0] and "build log: " in notices[0] and "set target.quantization" in notices[0]
    log = next(no_compiler.glob("kernels/q4-*/build.log"))
    assert "no C++ compiler" in log.read_text()


def test_an_explicit_w4a8_fails_fast_naming_the_key_the_choices_and_the_log(no_compiler):
    with pytest.raises(ModelLoadError) as err:
        choose(ModelConfig(source="x", quantization="w4a8", device="cpu"), "target")
    message = str(err.value)
    assert message.startswith('target.quantization = "w4a8" needs specchat\'s w4a8 kernel')
    assert (
        "build log: " in message and "choose one of none, 4bit, 8bit, int8, w8a8, w8a8-fast, auto, auto-fast" in message
    )
    assert "\n" not in message


def test_a_kernel_path_this_cpu_lacks_or_does_not_know_is_a_one_line_error():
    assert kernels.kernel_problem("auto") == ""
    assert "unknown kernel path" in kernels.kernel_problem("sse9")
    with pytest.raises(ConfigError, match="sse9"):
        load_config(None, ["runtime.kernel=sse9"])


def test_a_kernel_path_this_cpu_lacks_fails_the_load_instead_of_falling_back():
    with pytest.raises(
        ModelLoadError, match=r"runtime.kernel = sse9: unknown kernel path sse9 .*; use runtime.kernel=auto"
    ):
        choose(ModelConfig(source="x", quantization="auto", device="cpu"), "target", kernel_path="sse9")


def test_auto_loads_unquantized_off_the_cpu(monkeypatch):
    monkeypatch.setattr(quantization_choice, "resolve_device", lambda device: "cuda")
    assert choose(ModelConfig(source="x", quantization="auto"), "target").quantization == "none"
    assert choose(ModelConfig(source="x", quantization="w4a8"), "target").quantization == "w4a8"  # said at load


@pytest.mark.parametrize("cuda, mps, expected", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_device_auto_picks_cuda_then_mps_then_the_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert devices.resolve_device("auto") == expected


def qwen_dir(tmp_path, hidden: int, tokenizer):
    torch.manual_seed(hidden)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=hidden // 16,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    directory = tmp_path / f"qwen-{hidden}"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("hidden, unfit", [(64, 0), (96, 13)])
def test_a_small_pair_under_the_bundled_config_answers_and_stays_exact(tmp_path, monkeypatch, hidden, unfit):
    """hidden 64: every layer on the kernel; hidden 96: the layers reading 96 inputs stay unquantized
    (q, k, v, o, gate and up of both layers, and the head), said in one notice per model."""
    from model_files import greedy_reply

    from specchat.loading.models import load_pair
    from specchat.quant.w4a8 import Q4Linear
    from specchat.speculative.sampling import CompiledSampler

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    directory = qwen_dir(tmp_path, hidden, build_tokenizer())
    notices = []
    pair = load_pair(
        load_config(None, [f"target.source={directory}", f"drafter.source={directory}"]),
        lambda message, fraction: notices.append(message),
    )
    linears = [m for m in pair.target.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == unfit and sum(isinstance(m, Q4Linear) for m in pair.target.modules()) == 15 - unfit
    said = [notice for notice in notices if "stay unquantized" in notice]
    assert len(said) == (2 if unfit else 0)
    if unfit:
        assert said[0].startswith(f"target qwen-{hidden}: {unfit} linear layer(s) stay unquantized")
    ids = pair.tokenizer("def add(a, b):")["input_ids"]
    assert greedy_reply(pair, "spec", ids, n=12) == greedy_reply(pair, "target", ids, n=12)
    assert isinstance(pair.sampler, CompiledSampler)  # a pair on the compiled module samples with its probabilities
