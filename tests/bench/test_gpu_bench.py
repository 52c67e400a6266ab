"""The GPU check's bench (specchat/bench/gpu.py) run on the CPU at the tiny shape: it builds its checkpoints,
measures every method side by side, and its report says what it saw (the self pair accepts every draft)."""

from __future__ import annotations

import json

import pytest

from specchat.bench import gpu
from specchat.bench.synthetic import SHAPES, checkpoint


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bench")
    status = gpu.main(
        [
            "--out",
            str(out),
            "--device",
            "cpu",
            "--shapes",
            "tiny",
            "--variants",
            "float32",
            "--pairs",
            "small",
            "self",
            "--new-tokens",
            "10",
            "--prompts",
            "2",
            "--repeats",
            "2",
        ]
    )
    return status, json.loads((out / "gpu_bench.json").read_text()), (out / "gpu_bench.md").read_text()


def test_every_pair_is_measured_by_every_method(report):
    status, data, _ = report
    assert status == 0
    assert [(r["shape"], r["variant"], r["pair"]) for r in data["rows"]] == [
        ("tiny", "float32", "small"),
        ("tiny", "float32", "self"),
    ]
    for row in data["rows"]:
        assert set(row["tok_s"]) == {m.name for m in gpu.METHODS}
        assert all(rate > 0 for rate in row["tok_s"].values())
        assert set(row["forward_ms"]) == {"1", "5", "9"}


def test_the_self_pair_accepts_every_draft_and_float32_is_exact(report):
    rows = {r["pair"]: r for r in report[1]["rows"]}
    assert rows["self"]["alpha"] == 1.0
    assert rows["small"]["alpha"] < 1.0  # a drafter of other weights: the pairs really differ
    assert all(r["specchat_exact"] == "2/2" and r["hf_exact"] == "2/2" for r in rows.values())


def test_the_markdown_table_has_a_line_a_pair(report):
    lines = [line for line in report[2].splitlines() if line.startswith("| tiny |")]
    assert len(lines) == 2 and "| self |" in lines[1] and "100%" in lines[1]


def test_a_checkpoint_is_built_once_at_its_shape(tmp_path):
    first = checkpoint("tiny", tmp_path, "cpu")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert checkpoint("tiny", tmp_path, "cpu") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    config = json.loads((first / "config.json").read_text())
    assert config["hidden_size"] == SHAPES["tiny"].hidden and config["vocab_size"] == SHAPES["tiny"].vocab
