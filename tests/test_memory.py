"""Memory the chat reports: the process's resident set, and the bytes of the target's KV cache."""

from __future__ import annotations

import os

import torch
from conftest import make_engine, prompt_ids

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.memory import available_memory, resident_bytes
from specchat.speculative import model_io
from specchat.tui.stats_view import memory_text


def test_resident_memory_is_read_and_unknown_is_zero(tmp_path):
    assert resident_bytes() > 10 * 2**20  # this process holds torch: well over 10 MiB
    assert resident_bytes(tmp_path / "no-statm") == 0


def test_a_dynamic_cache_counts_its_keys_and_values(target, tokenizer):
    cache = model_io.new_kv_cache(target)
    assert isinstance(cache, model_io.TransformersKVCache) and model_io.kv_bytes(cache) == 0
    ids = prompt_ids(tokenizer, "def reverse(lst):")
    model_io.forward(target, cache, ids, keep=1)
    config = target.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    assert model_io.kv_bytes(cache) == per_token * len(ids)


def test_a_reply_reports_its_memory_in_stats_and_the_stats_view(target, similar_drafter_model, tokenizer):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = list(
        engine.stream(
            prompt_ids(tokenizer, "def add(a, b):"), SamplingConfig(max_new_tokens=6), SpeculationConfig(gamma=2)
        )
    )[-1]
    assert done.stats.kv_bytes == model_io.kv_bytes(engine.conversation.kv) > 0
    assert done.stats.resident_bytes > 0 and done.stats.to_dict()["kv_bytes"] == done.stats.kv_bytes
    text = memory_text(done.stats)
    assert (
        "GiB resident · target KV cache" in text
        and f"{done.stats.prompt_tokens + done.stats.new_tokens} tokens held" in text
    )


def test_a_lean_cache_counts_its_capacity():
    from specchat.runtime.lean import LeanKVCache

    cache = LeanKVCache(forward=None)
    cache.keys = [torch.zeros(2, 8, 4)]
    cache.values = [torch.zeros(2, 8, 4)]
    assert cache.nbytes == 2 * 2 * 8 * 4 * 4 == model_io.kv_bytes(cache)


def test_a_reply_gives_the_heaps_freed_pages_back_before_it_reads_its_resident_memory(target, tokenizer, monkeypatch):
    from specchat.speculative import reply as reply_module

    calls = []
    monkeypatch.setattr(reply_module, "release_freed_memory", lambda: calls.append("release"))
    monkeypatch.setattr(reply_module, "resident_bytes", lambda: calls.append("resident") or 1)
    engine = make_engine(target, None, tokenizer)
    done = list(
        engine.stream(
            prompt_ids(tokenizer, "def add(a, b):"), SamplingConfig(max_new_tokens=3), SpeculationConfig(mode="target")
        )
    )[-1]
    assert calls == ["release", "resident"] and done.stats.resident_bytes == 1


def test_available_memory_is_memavailable_or_the_physical_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683264 kB\nMemAvailable:   23281664 kB\n")
    assert available_memory(meminfo) == 23281664 * 1024
    meminfo.write_text("MemTotal:       24683264 kB\n")  # an old kernel: no MemAvailable
    assert available_memory(meminfo) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert available_memory(tmp_path / "missing") == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
