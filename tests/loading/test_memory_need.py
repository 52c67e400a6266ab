"""Memory told before it runs out (loading/memory_need.py): a pair that will not fit is one line with the figures
and what to change, before any weights load; in a process whose memory is capped, too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from model_files import tiny_qwen2, write_gguf
from tiny_models import build_tokenizer

from specchat.config import Config, ModelConfig, RuntimeConfig, UIConfig
from specchat.errors import ModelLoadError
from specchat.loading import memory_need
from specchat.loading.memory_need import GB, RUNTIME_BYTES, check_memory, model_need
from specchat.loading.plan import plan_pair

KV_A_TOKEN = 2 * 2 * (2 * 16) * 2  # layers × (keys, values) × 2 heads of 16 × float16


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    tok = build_tokenizer()
    return write_gguf(tmp_path_factory.mktemp("need") / "tiny.gguf", tiny_qwen2(len(tok)), tok)


def cfg_for(path, **ui) -> Config:
    return Config(target=ModelConfig(source=str(path), dtype="float32"), ui=UIConfig(**ui))


def test_the_need_is_the_weights_as_kept_and_the_kv_cache_a_token(gguf_path):
    cfg = cfg_for(gguf_path)
    [plan] = plan_pair(cfg)
    need = model_need(plan, "float16")
    params = sum(p.numel() for p in tiny_qwen2(len(build_tokenizer())).parameters())
    assert need.kv_per_token == KV_A_TOKEN and need.context == 512
    assert need.weights == pytest.approx(params * 4, rel=0.05)  # float32, unquantized: as loaded
    assert model_need(plan, "float32").kv_per_token == 2 * KV_A_TOKEN


def test_a_pair_that_does_not_fit_is_one_line_with_the_figures_and_a_context_that_fits(gguf_path):
    cfg = cfg_for(gguf_path, context_limit=10_000_000)
    plans = plan_pair(cfg)
    need = model_need(plans[0], "float16")
    fixed = need.weights + need.temporary + RUNTIME_BYTES
    room = fixed + 300_000 * KV_A_TOKEN  # room for 300k tokens of KV, not 10M
    with pytest.raises(ModelLoadError) as refused:
        check_memory(plans, cfg, available=(room, "memory available"))
    message = str(refused.value)
    assert "\n" not in message and f"KV at 10,000,000 tokens {10_000_000 * KV_A_TOKEN / GB:.1f} GB" in message
    assert f"memory available is {room / GB:.1f} GB" in message
    assert "set ui.context_limit=299008 or less" in message and "smaller quantization" in message
    check_memory(plans, replace(cfg, ui=UIConfig(context_limit=299_008)), available=(room, "memory available"))
    check_memory(plans, replace(cfg, runtime=RuntimeConfig(memory_check=False)), available=(1, "memory available"))


def test_pages_faulted_in_ahead_for_the_tiles_count_as_room(gguf_path, monkeypatch):
    cfg = cfg_for(gguf_path, context_limit=1_000_000)
    plans = plan_pair(cfg)
    need = model_need(plans[0], "float16")
    room = need.weights + need.temporary + RUNTIME_BYTES + 1_000_000 * KV_A_TOKEN  # just enough
    check_memory(plans, cfg, available=(room, "memory available"))
    with pytest.raises(ModelLoadError):
        check_memory(plans, cfg, available=(room - 4096, "memory available"))
    monkeypatch.setattr(memory_need, "held_bytes", lambda: 4096)  # held for this pair's own tiles (early_pages.py)
    check_memory(plans, cfg, available=(room - 4096, "memory available"))
    read = []  # held first: a page faulted in between the readings then counts in neither, never in both
    monkeypatch.setattr(memory_need, "held_bytes", lambda: read.append("held") or 4096)
    monkeypatch.setattr(memory_need, "available_bytes", lambda: read.append("available") or (room - 4096, "available"))
    check_memory(plans, cfg)
    assert read == ["held", "available"]


def test_a_process_whose_memory_is_capped_is_refused_before_loading(gguf_path, tmp_path):
    """RLIMIT_AS set to what the process maps now plus 300 MB; a context of 10M tokens needs 2.6 GB of KV."""
    script = textwrap.dedent(
        f"""
        import resource
        from specchat.config import Config, ModelConfig, SpeculationConfig, UIConfig
        from specchat.loading.memory_need import _mapped_bytes
        from specchat.loading.models import load_pair
        from specchat.errors import ModelLoadError

        resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + 300_000_000, resource.RLIM_INFINITY))
        cfg = Config(target=ModelConfig(source={str(gguf_path)!r}, dtype="float32"),
                     ui=UIConfig(context_limit=10_000_000), speculation=SpeculationConfig(mode="target"))
        try:
            load_pair(cfg)
        except ModelLoadError as err:
            print(err)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the process's RLIMIT_AS is 0." in done.stdout and "KV at 10,000,000 tokens 2.6 GB" in done.stdout
