"""The step profiler: time lands in the part that spent it, and the parts add up to the step."""

from __future__ import annotations

import copy
import time
from types import SimpleNamespace

import pytest
import torch
from tiny_models import build_model
from torch import nn

from specchat.bench import part_timing, profile
from specchat.quant.w8a8 import quantize_w8a8
from specchat.runtime import lean
from specchat.speculative import model_io


class SleepyLinear(nn.Linear):
    def forward(self, x):
        time.sleep(0.08)
        return super().forward(x)


class SleepyAttention(nn.Module):
    """An attention module that spends 10 ms of its own around an 80 ms projection."""

    def __init__(self):
        super().__init__()
        self.q_proj = SleepyLinear(4, 4)

    def forward(self, x):
        time.sleep(0.01)
        return self.q_proj(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = SleepyAttention()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        time.sleep(0.02)  # neither linear nor attention: "other"
        return self.norm(self.self_attn(x))


def test_projection_time_counts_as_matmuls_not_attention():
    block, x = Block(), torch.randn(1, 4)
    row = part_timing.split_forward([block], lambda: block(x), lambda: None, repeats=1)
    assert row["matmuls"] >= 70  # the split is scaled onto the unhooked total: a little less
    assert 8 <= row["attention"] < 60  # the 80 ms projection inside attention is not counted twice
    assert row["other"] >= 15
    assert abs(row["matmuls"] + row["attention"] + row["other"] - row["total"]) < 1e-6


def test_the_hooks_are_removed_afterwards():
    block, x = Block(), torch.randn(1, 4)
    part_timing.split_forward([block], lambda: block(x), lambda: None, repeats=1)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in block.modules())


@pytest.mark.parametrize("forward", ["transformers", "lean"])
def test_every_row_of_a_tiny_pair_splits_its_whole_step(target, similar_drafter_model, tokenizer, forward):
    models = [copy.deepcopy(target), copy.deepcopy(similar_drafter_model)]
    if forward == "lean":
        assert all(lean.attach_lean(model) == "" for model in models)
    pair = SimpleNamespace(target=models[0], drafter=models[1], vocab_size=len(tokenizer), eos_ids={0})
    context = tokenizer.encode("def reverse(lst):\n    return lst[::-1]\n" * 3)
    rows = profile.forward_rows(pair, context, gamma=3, vocab_limit=64, repeats=2)
    assert list(rows) == ["target · 1 token", "target · 4 tokens", "drafter · 1 token"]
    for row in rows.values():
        assert row["matmuls"] > 0 and row["attention"] > 0
        assert abs(row["matmuls"] + row["attention"] + row["other"] - row["total"]) < 1e-6
        assert row["kernel"] == 0  # no w8a8 or w4a8 layer in these models


@pytest.mark.parametrize(
    "mode, forward",
    [("w8a8", "transformers"), ("w8a8", "lean"), ("w4a8", "transformers"), ("w4a8", "lean"), ("w4a8", "lean compiled")],
)
def test_the_kernel_is_timed_inside_the_matmuls_of_a_quantized_model(target, tokenizer, forward, mode, request):
    model = copy.deepcopy(target).float()
    if mode == "w8a8":
        quantize_w8a8(model)
    else:
        from specchat.quant.w4a8 import quantize_w4a8

        model = build_model(len(tokenizer), seed=1, layers=2, hidden=128)
        quantize_w4a8(model, None, request.getfixturevalue("kernel"))
    if forward == "lean":  # q/k/v and gate/up run through w8a8.same_input, not their modules
        lean.attach_lean(model)
    elif forward == "lean compiled":  # the layers run in one C++ call, timed inside it
        lean.attach_lean(model, request.getfixturevalue("kernel").LeanLayers)
    pair = SimpleNamespace(target=model, drafter=None, vocab_size=len(tokenizer), eos_ids={0})
    rows = profile.forward_rows(pair, tokenizer.encode("hello world, hello"), gamma=2, vocab_limit=0, repeats=2)
    assert all(0 < row["kernel"] < row["matmuls"] and row["attention"] > 0 for row in rows.values())
    if forward == "lean compiled":
        assert getattr(model, model_io.RUNNER).native_loop() is not None
        assert all(row["matmuls"] + row["attention"] < row["total"] for row in rows.values())


def test_host_rows_time_greedy_and_sampled_verification(tokenizer):
    from specchat.speculative.sampling import TORCH_SAMPLER

    pair = SimpleNamespace(vocab_size=len(tokenizer), sampler=TORCH_SAMPLER)
    peaked = torch.full((9, len(tokenizer)), -30.0)
    peaked[:, 7] = 0.0  # a real reply's narrow nucleus
    for logits in (None, (peaked[:5], peaked[5:])):
        rows = profile.host_rows(pair, gamma=4, draft_width=100, repeats=3, logits=logits)
        assert set(rows) == {
            "verify, greedy (argmax and each row's log-sum-exp)",
            "verify, sampled (p from logits + rule)",
            "drafter sampling of 1 token",
        }
        assert all(ms > 0 for ms in rows.values())
    assert profile.real_logits(SimpleNamespace(drafter=None), [1, 2, 3], 2) is None


def test_bad_arguments_are_one_line_errors(capsys):
    assert profile.main(["--gamma", "0"]) == 2
    assert "--gamma" in capsys.readouterr().err


def test_prefill_rows_read_each_models_prompt_in_chunks_and_split_the_time(tokenizer, kernel, monkeypatch):
    from specchat.bench import prefill
    from specchat.quant.w4a8 import quantize_w4a8

    models = [build_model(len(tokenizer), seed=seed, layers=2, hidden=128) for seed in (1, 2)]
    for model in models:
        quantize_w4a8(model, None, kernel)
        lean.attach_lean(model, kernel.LeanLayers)
    fed = []
    real_forward = model_io.forward
    monkeypatch.setattr(
        model_io, "forward", lambda m, c, ids, keep: fed.append(len(ids)) or real_forward(m, c, ids, keep)
    )
    pair = SimpleNamespace(target=models[0], drafter=models[1])
    ids = prefill.prompt_ids(tokenizer, "def f(x):\n    return x\n", 70)
    assert len(ids) == 70
    rows = prefill.prefill_rows(pair, ids, [20, 70], chunk=32)
    assert list(rows) == ["target · 20 tokens", "target · 70 tokens", "drafter · 20 tokens", "drafter · 70 tokens"]
    assert fed == [20] * 2 + [32, 32, 6] * 2 + [20] * 2 + [32, 32, 6] * 2  # each read twice: untimed, then split
    for name, row in rows.items():
        assert 0 < row["kernel"] <= row["matmuls"] and row["attention"] > 0
        assert row["tokens/s"] == pytest.approx(int(name.split()[2]) / row["total"] * 1e3)
    table = prefill.prefill_table(rows, 32)
    assert "| prompt read in chunks of 32 |" in table and table.count("\n") == 5


def test_prefill_arguments_are_checked(capsys):
    assert profile.main(["--prefill", "0"]) == 2
    assert "--prefill" in capsys.readouterr().err
    assert profile.main(["--prefill", "512", "--chunk", "0"]) == 2
