"""/why and /trace: the p and q they report are the models' own probabilities at those positions
(recomputed here with plain full forwards), and min(1, p/q) agrees with what the verifier decided."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import make_engine, reference_probs

from specchat.config import Config, SamplingConfig, SpeculationConfig
from specchat.session.chat import ChatSession
from specchat.settings import with_value
from specchat.speculative.events import Origin
from specchat.tui.commands import build_registry

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingConfig(temperature=0.8, top_k=50, max_new_tokens=24, seed=3)


def chat(target, drafter_model, tokenizer, sampling, gamma=3):
    engine = make_engine(target, drafter_model, tokenizer)
    return ChatSession(engine, tokenizer, Config(sampling=sampling, speculation=SpeculationConfig(gamma=gamma)), 1024)


def answer(session, text):
    for _ in session.reply(text):
        pass
    return session.records[-1]


def law(model, ids: list[int], sampling: SamplingConfig) -> dict[int, float]:
    """The model's next-token probabilities after `ids`, from one full forward with no cache: plain
    softmax in greedy mode, else the sampling settings' law written from the definitions."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1, :]
    if sampling.is_greedy:
        return dict(enumerate(torch.softmax(logits.double(), dim=-1).tolist()))
    return reference_probs(logits, sampling)


def positions(session, record):
    """Each token's prefix: the prompt plus the reply's tokens before it."""
    prompt = session.last_prompt_ids
    reply = [t.id for t in record.tokens]
    return {(t.step, t.position): prompt + reply[:k] for k, t in enumerate(record.tokens)}


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_reported_p_and_q_are_the_models_probabilities_there(target, similar_drafter_model, tokenizer, sampling):
    session = chat(target, similar_drafter_model, tokenizer, sampling)
    record = answer(session, "write a function that reverses a list")
    prefixes = positions(session, record)
    assert record.rejections and any(t.origin == Origin.DRAFTED for t in record.tokens)
    for token in record.tokens:
        prefix = prefixes[(token.step, token.position)]
        assert token.odds.p == pytest.approx(law(target, prefix, sampling).get(token.id, 0.0), abs=1e-4)
        if token.origin == Origin.DRAFTED:
            assert token.odds.q == pytest.approx(law(similar_drafter_model, prefix, sampling)[token.id], abs=1e-4)
    for r in record.rejections:
        prefix = prefixes[(r.step, r.position)]  # the corrected token sits where the refused draft was
        target_law, drafter_law = law(target, prefix, sampling), law(similar_drafter_model, prefix, sampling)
        assert r.p == pytest.approx(target_law.get(r.drafted, 0.0), abs=1e-4)
        assert r.q == pytest.approx(drafter_law[r.drafted], abs=1e-4)
        best = sorted(target_law.items(), key=lambda kv: -kv[1])[:5]
        assert [i for i, _ in r.target_top] == [i for i, _ in best]
        assert r.drafter_top[0][0] == max(drafter_law, key=drafter_law.get)


def test_greedy_rule_agrees_with_the_verifier(target, similar_drafter_model, tokenizer):
    session = chat(target, similar_drafter_model, tokenizer, GREEDY)
    record = answer(session, "explain a hash map")
    prefixes = positions(session, record)
    for token in record.tokens:
        if token.origin == Origin.DRAFTED:
            assert token.odds.accept_p == 1.0
    for r in record.rejections:
        with torch.no_grad():
            logits = target(torch.tensor([prefixes[(r.step, r.position)]])).logits[0, -1]
        assert r.accept_p is None and int(logits.argmax()) == r.emitted != r.drafted
        assert r.margin == pytest.approx(float(logits.max() - logits[r.drafted]), abs=1e-4) and r.margin >= 0


def test_sampled_acceptance_probabilities_add_up_to_the_accepted_drafts(target, similar_drafter_model, tokenizer):
    """Each judged draft is accepted with probability min(1, p/q): over many judged drafts, their sum
    is the expected number accepted (within 4 standard deviations), and none refused had p >= q."""
    session = chat(target, similar_drafter_model, tokenizer, SamplingConfig(temperature=1.0, max_new_tokens=40))
    judged, accepted = [], 0
    for turn in range(6):
        session.reset()
        session.config = with_value(session.config, "sampling.seed", turn)
        record = answer(session, f"story number {turn}")
        drafted = [t.odds.accept_p for t in record.tokens if t.origin == Origin.DRAFTED]
        judged += drafted + [r.accept_p for r in record.rejections]
        accepted += len(drafted)
        assert all(0.0 < a <= 1.0 for a in drafted)
        assert all(r.accept_p < 1.0 and r.accept_p == pytest.approx(min(1.0, r.p / r.q)) for r in record.rejections)
    expected = sum(judged)
    sd = sum(a * (1 - a) for a in judged) ** 0.5
    assert len(judged) > 60 and abs(accepted - expected) <= 4 * sd + 1


def test_why_and_trace_commands(target, similar_drafter_model, tokenizer, tmp_path):
    registry = build_registry()
    session = chat(target, similar_drafter_model, tokenizer, GREEDY)
    assert "no reply yet" in registry.run(session, "/why").message
    record = answer(session, "hello")
    n = len(record.rejections)
    assert not registry.run(session, "/why").error
    assert not registry.run(session, f"/why {n}").error
    for bad in (f"/why {n + 1}", "/why 0", "/why x"):
        outcome = registry.run(session, bad)
        assert outcome.error and f"from 1 to {n}" in outcome.message
    answer(session, "and again")
    path = tmp_path / "trace.jsonl"
    outcome = registry.run(session, f"/trace all {path}")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert outcome.message == f"wrote {len(lines)} token records to {path}"
    kept = [line for line in lines if line["origin"] != "rejected"]
    assert [line["id"] for line in kept] == [t.id for r in session.records for t in r.tokens]
    assert {line["reply"] for line in lines} == {1, 2}
    refused = [line for line in lines if line["origin"] == "rejected"]
    assert len(refused) == sum(len(r.rejections) for r in session.records) > 0
    assert set(lines[0]) == {"reply", "step", "pos", "id", "text", "origin", "source", "p", "q", "accept_p"}
    assert {line["source"] for line in lines if line["origin"] in ("drafted", "rejected")} == {"model"}
    assert {line["source"] for line in lines if line["origin"] not in ("drafted", "rejected")} == {None}
    assert "exists; use /trace! " in registry.run(session, f"/trace {path}").message  # never clobbered by accident
    registry.run(session, f"/trace! {path}")
    assert {json.loads(line)["reply"] for line in path.read_text().splitlines()} == {2}
    for bad in ("/trace", f"/trace {tmp_path / 'x.txt'}", f"/trace all {tmp_path / 'missing' / 'x.jsonl'}"):
        outcome = registry.run(session, bad)
        assert outcome.error and outcome.message.startswith("/trace: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.jsonl"]


def test_why_says_what_drafted_a_refused_token(target, similar_drafter_model, tokenizer):
    from rich.console import Console

    from specchat.tui.why_view import rejection_detail, rejections_table

    session = chat(target, similar_drafter_model, tokenizer, GREEDY)
    record = answer(session, "hello")
    assert record.rejections and {r.source for r in record.rejections} == {"model"}
    copied = dataclasses.replace(record.rejections[0], source="lookup")
    console = Console(width=200, record=True)
    console.print(rejections_table(tokenizer, [record.rejections[0], copied]))
    console.print(rejection_detail(tokenizer, 2, copied))
    text = console.export_text()
    assert "draft 1 (by the model)" in text.replace(f"draft {record.rejections[0].position + 1} (", "draft 1 (")
    assert "(copied by lookup)" in text and ", copied by lookup" in text
