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


def test_a_large_shape_is_written_in_blocks_with_q4_k_ms_mix_and_loads(tmp_path, monkeypatch, kernel):
    """`real_shape.py blocks`: a file of a shape in random blocks of one type, no float checkpoint; Q4_K_M keeps the
    output and every other layer's attn_v and ffn_down in Q6_K, as llama-quantize's mix does."""
    import gguf

    module = real_shape()
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(module, "qwen_tokenizer", lambda cache: build_tokenizer())
    path = tmp_path / "tiny-Q4_K_M.gguf"
    assert (
        module.main(
            ["blocks", "--shape", "tiny-blocks", "--type", "Q4_K_M", "--out", str(path), "--tokenizer-cache", "x"]
        )
        == 0
    )
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert kinds["output.weight"] == kinds["blk.0.attn_v.weight"] == kinds["blk.0.ffn_down.weight"] == "Q6_K"
    assert kinds["blk.1.attn_v.weight"] == kinds["blk.0.ffn_up.weight"] == kinds["token_embd.weight"] == "Q4_K"
    assert kinds["blk.0.attn_q.bias"] == "F32" and not (tmp_path / "tiny-Q4_K_M.gguf.part").exists()
    pair, _, prompt, reply = module.specchat_decoder(path, tokens=4, context=12)
    assert pair.target_facts.quantization == "Q4_K_M→w4a8" and reply() > 0
    q8 = tmp_path / "tiny-Q8_0.gguf"
    assert (
        module.main(["blocks", "--shape", "tiny-blocks", "--type", "Q8_0", "--out", str(q8), "--tokenizer-cache", "x"])
        == 0
    )
    assert {
        t.tensor_type.name for t in gguf.GGUFReader(q8).tensors if t.name.endswith(".weight") and "norm" not in t.name
    } == {"Q8_0"}
    assert int(gguf.GGUFReader(q8).fields["general.file_type"].parts[-1][0]) == gguf.LlamaFileType.MOSTLY_Q8_0


def test_llama_benchs_prompts_of_5_and_9_give_their_ratios(tmp_path):
    rows = [
        {"n_prompt": 0, "n_gen": 64, "avg_ts": 10.0},
        {"n_prompt": 1, "n_gen": 0, "avg_ts": 10.0},  # T(1) 100 ms
        {"n_prompt": 5, "n_gen": 0, "avg_ts": 40.0},  # T(5) 125 ms
        {"n_prompt": 9, "n_gen": 0, "avg_ts": 45.0},  # T(9) 200 ms
    ]
    (tmp_path / "bench.json").write_text(__import__("json").dumps(rows))
    result = real_shape().llama_bench_rows(tmp_path / "bench.json", "f.gguf", 32)
    assert result["tg_tok_s"] == 10.0 and result["t5_over_t1"] == pytest.approx(1.25)
    assert result["t9_over_t1"] == pytest.approx(2.0)


def test_the_table_says_how_many_rounds_each_file_had(tmp_path):
    """Results of several runs put together: the rounds line gives the range, not an average."""
    row = {"t1_ms": 100.0, "t5_over_t1": 1.2, "t9_over_t1": 1.8, "threads": 2, "build": "b1"}
    entries = [
        {**row, "file": "a.gguf", "tool": tool, "tg_tok_s": 5.0, "decode_tok_s": 7.0, "kernel": "avx2"}
        for tool in ("llama.cpp", "specchat")
        for _ in range(4)
    ] + [
        {**row, "file": "b.gguf", "tool": tool, "tg_tok_s": 5.0, "decode_tok_s": 7.0}
        for tool in ("llama.cpp", "specchat")
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(__import__("json").dumps(e) for e in entries))
    assert " · 1–4 round(s), medians" in real_shape().table(results).splitlines()[0]
    results.write_text("\n".join(__import__("json").dumps(e) for e in entries[:8]))
    assert " · 4 round(s), medians" in real_shape().table(results).splitlines()[0]
