"""Weights that are not numbers are refused at load, in one line naming the weight, in every quantization: before,
NaN weights in w4a8 were a ValueError traceback and inf or 1e38 ones a model repeating one token."""

from __future__ import annotations

import pytest
import torch
from model_files import tiny_qwen2, write_gguf
from tiny_models import build_tokenizer

from specchat.config import ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading.finite import check_weight
from specchat.loading.models import load_model


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture
def cache(tmp_path, monkeypatch, kernel):
    """A cache of the test's own, with the machine's built w4a8 kernel in it (no second compile)."""
    from specchat.cache_folder import cache_dir

    built = cache_dir() / "kernels"
    root = tmp_path / "cache"
    root.mkdir()
    (root / "kernels").symlink_to(built, target_is_directory=True)
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    return root


def damaged_gguf(path, tok, value: float):
    model = tiny_qwen2(len(tok), seed=3)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 5] = value
    return write_gguf(path, model, tok)


NAN, INF, HUGE = (float("nan"), "NaN or infinite"), (float("inf"), "NaN or infinite"), (1e38, "a value of 1e\\+38")


@pytest.mark.parametrize(
    "quantization, value, said",
    [("none", *NAN), ("w8a8", *NAN), ("w4a8", *NAN), ("w4a8", *INF), ("w4a8", *HUGE), ("w8a8", *HUGE)],
)
def test_a_weight_that_is_no_number_is_refused_in_every_quantization(tmp_path, tok, cache, quantization, value, said):
    path = damaged_gguf(tmp_path / "damaged.gguf", tok, value)
    with pytest.raises(ModelLoadError, match=f"blk.0.ffn_up.weight|up_proj.weight.* holds {said}") as err:
        load_model(ModelConfig(source=str(path), dtype="float32", quantization=quantization))
    assert "\n" not in str(err.value) and "the file is damaged" in str(err.value)


def test_the_check_reads_a_tensor_once_and_passes_over_what_is_not_a_weight():
    check_weight("m", "w", torch.randn(64, 64))  # an ordinary weight
    check_weight("m", "w", torch.tensor([float("nan")]).to(torch.uint8))  # integer blocks are not judged
    check_weight("m", "w", torch.empty(0))
    with pytest.raises(ModelLoadError, match="m: its weight w holds NaN"):
        check_weight("m", "w", torch.tensor([[1.0, float("nan")], [0.0, 2.0]], dtype=torch.bfloat16))
