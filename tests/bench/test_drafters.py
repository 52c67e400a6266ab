"""The drafter comparison: agreement is perfect for the target itself, lower for a noisier drafter, and the
sampled acceptance is Σ min(p, q) at each reply position."""

from __future__ import annotations

import pytest
import torch

from specchat.bench import drafters
from specchat.config import Config, SamplingConfig
from specchat.loading.models import ModelFacts

SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9)


def _target(model, tokenizer) -> drafters.Target:
    return drafters.Target(model, tokenizer, ModelFacts("tiny", "tiny", 0, "float32", "none", "cpu", 0, 0.0))


@pytest.fixture
def replies(target, tokenizer):
    prompts = [tokenizer.encode("def reverse(lst):"), tokenizer.encode("Hello, how are you")]
    said = []
    replies = drafters.target_replies(_target(target, tokenizer), prompts, 12, SAMPLED, said.append)
    assert said == ["the target's reply to prompt 1 of 2", "the target's reply to prompt 2 of 2"]
    return replies


def test_the_target_agrees_with_itself_everywhere(target, tokenizer, replies):
    assert [len(r.reply) for r in replies] == [12, 12]
    assert all(torch.equal(r.greedy, torch.tensor(r.reply)) for r in replies)  # its reply is its own argmax
    greedy, sampled = drafters.agreement(replies, target, len(tokenizer), SAMPLED)
    assert greedy == 1.0 and sampled == pytest.approx(1.0, abs=1e-5)


def test_a_noisier_drafter_agrees_less_and_its_acceptance_is_the_overlap_of_the_laws(
    similar_drafter_model, unrelated_drafter_model, tokenizer, replies
):
    width = len(tokenizer)
    similar = drafters.agreement(replies, similar_drafter_model, width, SAMPLED)
    unrelated = drafters.agreement(replies, unrelated_drafter_model, width, SAMPLED)
    assert unrelated[0] < similar[0] < 1 and unrelated[1] < similar[1] < 1
    overlap = 0.0  # Σ min(p, q) by hand, position by position
    for r in replies:
        logits = similar_drafter_model(torch.tensor([r.prompt + r.reply[:-1]])).logits[0, -len(r.reply) :, :width]
        q = torch.softmax(logits.float() / 0.7, -1)
        kept = torch.where(q >= _nucleus_floor(q, 0.9), q, 0)
        q = kept / kept.sum(-1, True)
        overlap += float(torch.minimum(r.p, q).sum())
    assert similar[1] == pytest.approx(overlap / sum(len(r.reply) for r in replies), abs=1e-4)


def _nucleus_floor(q: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, 1] the least probability top-p keeps in each row."""
    top = q.sort(-1, descending=True).values
    kept = ((top.cumsum(-1) - top) < top_p).sum(-1, keepdim=True)
    return top.gather(-1, kept - 1)


def test_compare_loads_each_mode_and_reports_a_line(target, similar_drafter_model, tokenizer, replies, monkeypatch):
    from specchat.loading import models

    loaded = []

    def load_model(mc, progress, role, kv_cache):
        loaded.append((mc.quantization, role, kv_cache))
        return (
            similar_drafter_model,
            tokenizer,
            ModelFacts("tiny-drafter", "tiny", 0, "float32", mc.quantization, "cpu", 2_000_000, 0.0),
        )

    monkeypatch.setattr(models, "load_model", load_model)
    lines = []
    results = drafters.compare(Config(), _target(target, tokenizer), ["none", "int8"], replies, SAMPLED, lines.append)
    assert [m for m, _, _ in loaded] == ["none", "int8"] and {r for _, r, _ in loaded} == {"drafter"}
    assert [r["mode"] for r in results] == ["none", "int8"] and results[0]["greedy"] == results[1]["greedy"]
    assert all(r["positions"] == 24 and r["t1_ms"] > 0 for r in results)
    assert "greedy agreement" in lines[0] and "sampled acceptance" in lines[0] and "2 MB" in lines[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "w4a4"], "--modes takes quantizations"),
        (["--top-p", "0"], "--top-p in (0, 1]"),
        (["drafter.source="], "no drafter to compare"),
    ],
)
def test_bad_arguments_get_one_line_and_status_2(argv, message, capsys):
    assert drafters.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
