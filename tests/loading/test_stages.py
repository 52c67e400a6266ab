"""Each stage of loading (loading/models.py's pipeline) called alone, on a tiny local model: resolve (plan.py),
the materialise steps (checkpoint.py, weights.py, quantize.py, shared_tokenizer.py) and attach (attach.py)."""

from __future__ import annotations

import pytest
import torch
from model_files import save_dir
from test_gguf_architectures import cache, on_the_cpu, tok
from tiny_models import build_model

from specchat.config import Config, ModelConfig, RuntimeConfig
from specchat.errors import ModelLoadError
from specchat.loading import plan
from specchat.loading.attach import attach, pair_sampler
from specchat.loading.checkpoint import checkpoint_for, directory_identity
from specchat.loading.plan import plan_model, plan_pair
from specchat.loading.quantize import quantize
from specchat.loading.shared_tokenizer import shared_tokenizer
from specchat.loading.weights import load_weights
from specchat.quant.int8_weights import Int8Linear
from specchat.speculative.sampling import TORCH_SAMPLER

FIXTURES = (cache, on_the_cpu, tok)  # test_gguf_architectures' autouse fixtures, on here too


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok):
    return save_dir(tmp_path_factory.mktemp("tiny"), build_model(len(tok), seed=1, layers=1, hidden=64), tok)


def test_resolve_settles_a_local_model_without_reading_its_weights(model_dir, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("read"))
    settled = plan_model(ModelConfig(source=str(model_dir), dtype="float32", quantization="int8"), "drafter")
    assert (settled.source.kind, settled.source.location, settled.written) == ("dir", str(model_dir), str(model_dir))
    assert (settled.device, settled.dtype, settled.quantization) == ("cpu", torch.float32, "int8")
    assert settled.placement == {"dtype": torch.float32, "device_map": {"": "cpu"}}
    assert settled.label == f"drafter {model_dir.name}"


def test_resolve_orders_a_pair_and_refuses_what_cannot_run_here(model_dir, monkeypatch):
    local = ModelConfig(source=str(model_dir), dtype="float32")
    pair = plan_pair(Config(target=local, drafter=local, runtime=RuntimeConfig(kv_cache="float32")))
    assert [p.role for p in pair] == ["target", "drafter"] and {p.kv_cache for p in pair} == {"float32"}
    with pytest.raises(ModelLoadError, match="revision = 'main' only applies to hub ids"):
        plan_model(ModelConfig(source=str(model_dir), dtype="float32", revision="main"))
    monkeypatch.setattr(plan, "resolve_device", lambda device: device)
    with pytest.raises(ModelLoadError, match="put both on"):
        plan_model(ModelConfig(source=str(model_dir), device="cpu"), "drafter", beside="cuda")


def test_a_checkpoint_is_where_and_how_from_pretrained_reads(model_dir):
    local = checkpoint_for(plan_model(ModelConfig(source=str(model_dir), dtype="float32")))
    assert (local.location, local.local, local.quantization, local.slim) == (str(model_dir), True, "none", False)
    assert local.identity == directory_identity(model_dir) and local.gguf is None
    assert local.load_kwargs == {"trust_remote_code": False, "local_files_only": True}
    hub = checkpoint_for(plan_model(ModelConfig(source="org/model", dtype="float32", revision="v1")))
    assert (hub.location, hub.local, len(hub.identity)) == ("org/model", False, 64)
    assert hub.load_kwargs == {"trust_remote_code": False, "revision": "v1"}  # nothing downloaded yet


def test_weights_then_quantization_then_the_tokenizer_each_alone(model_dir, tok):
    planned = plan_model(ModelConfig(source=str(model_dir), dtype="float32", quantization="int8"))
    checkpoint = checkpoint_for(planned)
    weights = load_weights(checkpoint, planned)
    assert not weights.model.training and weights.params == sum(p.numel() for p in weights.model.parameters())
    quantized = quantize(weights.model, checkpoint, planned)
    assert (quantized.dtype, quantized.label) == (torch.float32, "int8")
    assert any(isinstance(module, Int8Linear) for module in quantized.model.modules())
    shared: dict = {}
    tokenizer, template = shared_tokenizer(checkpoint, planned, shared)
    assert template == "own" and len(tokenizer) == len(tok)
    assert shared_tokenizer(checkpoint, planned, shared)[0] is tokenizer  # the same files: read once


def test_attach_labels_the_forward_it_runs_on(model_dir):
    for backend in ("transformers", "lean"):
        planned = plan_model(ModelConfig(source=str(model_dir), dtype="float32", backend=backend))
        model = load_weights(checkpoint_for(planned), planned).model
        attached = attach(model, planned)
        assert attached.kernel == ""  # no w4a8: no kernel path
        assert attached.backend in (
            {"transformers"} if backend == "transformers" else {"lean", "lean (compiled layers)"}
        )
    assert pair_sampler("", "") is TORCH_SAMPLER
