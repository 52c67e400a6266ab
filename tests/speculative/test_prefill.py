"""A new prompt is read in chunks: progress after each, a cancel between any two, and exact replies after."""

from __future__ import annotations

import threading

import pytest
from conftest import hf_greedy, make_engine, prompt_ids, run_reply

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative import model_io
from specchat.speculative.events import PrefillProgress, ReplyDone, Token
from specchat.tui import render

CHUNK = 64
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)


@pytest.fixture
def long_prompt(tokenizer) -> list[int]:
    ids = prompt_ids(tokenizer, " ".join(f"item {i} is {i * 7 % 13}" for i in range(60)))
    assert 3 * CHUNK < len(ids) < 1000
    return ids


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(model_io, "PREFILL_CHUNK", CHUNK)


@pytest.mark.parametrize("mode", ["spec", "target", "drafter"])
def test_a_long_prompt_is_read_in_chunks_with_progress(target, similar_drafter_model, tokenizer, long_prompt, mode):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    events = list(engine.stream(long_prompt, GREEDY, SpeculationConfig(gamma=4, mode=mode)))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    total = len(long_prompt) - 1  # the newest token is fed by the first step
    assert [p.done for p in progress] == [*range(CHUNK, total, CHUNK), total]
    assert {p.total for p in progress} == {total}
    assert all(isinstance(e, PrefillProgress) for e in events[: len(progress)])  # before any token
    done = events[-1]
    assert done.stats.prefill_tokens == total and 0 < done.stats.prefill_s <= done.stats.wall_s
    reference = hf_greedy(similar_drafter_model if mode == "drafter" else target, long_prompt, 12)
    assert list(done.ids) == reference


@pytest.mark.parametrize("chunks_before_cancel", [0, 1, 3])
def test_a_cancel_between_chunks_stops_the_reading_and_the_next_reply_is_exact(
    target, similar_drafter_model, tokenizer, long_prompt, chunks_before_cancel
):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    cancel, seen = threading.Event(), 0
    if chunks_before_cancel == 0:
        cancel.set()
    for event in engine.stream(long_prompt, GREEDY, SpeculationConfig(gamma=4), cancel):
        assert not isinstance(event, Token)
        if isinstance(event, PrefillProgress):
            seen += 1
            if seen == chunks_before_cancel:
                cancel.set()
        done = event
    assert isinstance(done, ReplyDone) and done.stop_reason == "cancelled" and done.ids == ()
    assert seen == chunks_before_cancel
    assert engine.target_seen == engine.drafter.seen == chunks_before_cancel * CHUNK  # whole chunks only
    _, again = run_reply(engine, long_prompt, GREEDY, gamma=4)  # the same prompt: its read part is reused
    assert list(again.ids) == hf_greedy(target, long_prompt, 12)
    assert again.stats.prefill_tokens == len(long_prompt) - 1 - chunks_before_cancel * CHUNK  # only the rest
    other = prompt_ids(tokenizer, "The quick brown fox")
    _, third = run_reply(engine, other, GREEDY, gamma=4)
    assert list(third.ids) == hf_greedy(target, other, 12)


def test_the_progress_line_reads_as_the_issue_says():
    progress = PrefillProgress(done=1536, total=4102, seconds=7.245)
    assert render.prefill_text(progress) == "reading prompt 1,536 / 4,102 tokens · 212 tok/s"


def test_the_stats_line_shows_the_prompt_reading_apart_and_the_generation_rate_without_it():
    from specchat.speculative.metrics import ReplyStats

    stats = ReplyStats(mode="target", new_tokens=10, wall_s=20.0, ttft_s=19.5, prefill_tokens=4102, prefill_s=19.3)
    assert render.stats_line(stats) == (
        " 10 tok · 14.3 tok/s · ttft 19.50 s · prompt 4,102 tok in 19.3 s (213 tok/s) · target only"
    )  # 10 tokens in the 0.7 s after the reading, not in 20 s
    short = ReplyStats(
        mode="target", new_tokens=10, wall_s=2.0, ttft_s=0.5, prefill_tokens=40, prefill_s=0.2, reused_tokens=1960
    )
    assert " · prompt 40 tok in 0.20 s (200 tok/s, 1,960 more cached) · " in render.stats_line(short)
