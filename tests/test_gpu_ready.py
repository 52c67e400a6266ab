"""GPU readiness (issue 17), tested on this CPU: what a shipped config would do the first time it meets a
GPU, with the device decisions monkeypatched. The tests that need a real GPU are in tests/gpu/."""
from __future__ import annotations

import pytest
import torch

from specchat.bench.tiny_models import build_model, build_tokenizer
from specchat.config import ModelConfig
from specchat.loading import models


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("target")
    build_model(len(tok), seed=1, layers=2).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def pretend_gpu(monkeypatch, device: str = "cuda:0") -> None:
    """load_model decides for `device`, but the weights still land on the CPU (there is no GPU here)."""
    monkeypatch.setattr(models, "resolve_device", lambda asked: device)
    monkeypatch.setattr(models, "resolve_dtype", lambda dtype, device: torch.float32)
    place = models.placement_kwargs
    monkeypatch.setattr(models, "placement_kwargs", lambda mc, role, device, dtype: place(mc, role, "cpu", dtype))


# ----- item 4: weight-only int8 is for the CPU ---------------------------------------------------
def test_int8_off_the_cpu_loads_unquantized_with_one_notice(target_dir, cache, monkeypatch):
    pretend_gpu(monkeypatch)
    notices = []
    model, _tok, facts = models.load_model(ModelConfig(source=str(target_dir), quantization="int8", device="cuda"),
                                           lambda message, fraction: notices.append(message), role="drafter")
    quantizing = [m for m in notices if "int8" in m]
    assert quantizing == ["drafter: quantization int8 is fast on the CPU only (elsewhere it dequantizes every "
                          "weight on every call); loading it unquantized on cuda:0"]
    assert facts.quantization == "none"
    assert all(isinstance(m, torch.nn.Linear) for name, m in model.named_modules() if name.endswith("proj"))
    assert not (cache / "quantized").exists()  # nothing quantized, nothing cached


def test_int8_on_the_cpu_stays_int8(target_dir, cache):
    from specchat.core.int8_weights import Int8Linear
    model, _tok, facts = models.load_model(ModelConfig(source=str(target_dir), quantization="int8", device="cpu",
                                                       dtype="float32"))
    assert facts.quantization == "int8"
    assert any(isinstance(m, Int8Linear) for m in model.modules())
