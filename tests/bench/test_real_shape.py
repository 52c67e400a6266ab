"""scripts/real_shape.py's specchat half (what scripts/real_shape.sh times beside llama-bench): it loads a GGUF as the
chat does and decodes target-only; run here on a tiny file so that an engine change cannot break it unseen."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from model_files import typed_pair_files
from tiny_models import build_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def real_shape():
    path = Path(__file__).resolve().parents[2] / "scripts" / "real_shape.py"
    spec = importlib.util.spec_from_file_location("real_shape", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_specchat_half_decodes_a_gguf_target_only(tmp_path, monkeypatch, kernel):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target, _ = typed_pair_files(tmp_path, build_tokenizer(), "Q6_K", "qwen2")
    pair, load_s, prompt, reply = real_shape().specchat_decoder(target, tokens=6, context=12)
    assert load_s > 0 and len(prompt) == 12
    assert reply() > 0 and reply() > 0  # twice: the engine resets between replies
