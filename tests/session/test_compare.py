"""Comparison mode: target-only reruns beside the reply, without touching the chat's state."""

from __future__ import annotations

import dataclasses
import io

import torch
from conftest import make_engine
from rich.console import Console

from specchat.config import RANDOM, Config
from specchat.loading.models import LoadedPair, ModelFacts
from specchat.session.chat import ChatSession
from specchat.session.compare import Comparer, CompareReport
from specchat.settings import with_value
from specchat.tui.compare_view import CompareView, view_compare_fn


def session_with_compare(target, drafter, tokenizer, compare="on", temperature=0.0):
    cfg = with_value(Config(), "speculation.compare", compare)
    cfg = with_value(cfg, "sampling.max_new_tokens", 24)
    cfg = with_value(cfg, "sampling.temperature", temperature)
    facts = ModelFacts("tiny", "test", 1, "float32", "none", "cpu", 0, 0.0)
    comparer = Comparer(
        LoadedPair(
            target, drafter, tokenizer, {2}, len(tokenizer), context_limit=1024, target_facts=facts, drafter_facts=facts
        )
    )
    session = ChatSession(
        make_engine(target, drafter, tokenizer, eos_ids={2}), tokenizer, cfg, 1024, compare_fn=comparer
    )
    return session, comparer


def reports(events):
    return [e for e in events if isinstance(e, CompareReport)]


def test_greedy_compare_is_identical_and_leaves_the_chat_untouched(target, similar_drafter_model, tokenizer):
    session, _ = session_with_compare(target, similar_drafter_model, tokenizer)
    [report] = reports(list(session.reply("Hello, how are you")))
    first_prompt = list(session.last_prompt_ids)
    assert report.identical and report.greedy and report.divergence is None
    assert report.target.label == "target-only" and report.target.stats.drafted == 0
    assert report.speedup > 0
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    [report2] = reports(list(session.reply("and the fox?")))
    assert report2.identical
    # the chat's own cache was reused past the first prompt: the reruns did not replace it
    assert session.records[-1].stats.reused_tokens >= len(first_prompt)


def test_compare_drafter_adds_a_drafter_only_run(target, similar_drafter_model, tokenizer):
    session, _ = session_with_compare(target, similar_drafter_model, tokenizer, compare="drafter")
    [report] = reports(list(session.reply("The quick brown")))
    assert [r.label for r in report.others] == ["target-only", "drafter-only"]
    assert report.others[1].stats.drafted == 0 and report.others[1].stats.target_forwards == 0


def test_sampled_compare_uses_the_same_seed(target, similar_drafter_model, tokenizer):
    session, _ = session_with_compare(target, similar_drafter_model, tokenizer, temperature=0.9)
    [first] = reports(list(session.reply("The quick brown")))
    session.reset()
    [second] = reports(list(session.reply("The quick brown")))
    assert first.target.ids == second.target.ids and first.spec.ids == second.spec.ids


def test_with_a_random_seed_the_rerun_uses_the_replys_own_seed(target, similar_drafter_model, tokenizer, monkeypatch):
    import specchat.speculative.reply

    session, _ = session_with_compare(target, similar_drafter_model, tokenizer, temperature=0.9)
    session.config = with_value(session.config, "sampling.seed", RANDOM)
    seeds = []
    real = specchat.speculative.reply.make_generator
    monkeypatch.setattr(
        specchat.speculative.reply, "make_generator", lambda seed, device: seeds.append(seed) or real(seed, device)
    )
    events = list(session.reply("The quick brown"))
    [report] = reports(events)
    done = [e for e in events if type(e).__name__ == "ReplyDone"][0]
    assert len(seeds) == 2 and seeds[0] == seeds[1] == done.seed >= 0  # drawn once, reused by the rerun


def test_a_greedy_difference_is_explained_with_the_target_margin(target, similar_drafter_model, tokenizer):
    _, comparer = session_with_compare(target, similar_drafter_model, tokenizer)
    prompt = tokenizer.encode("for i in range")
    with torch.no_grad():
        logits = target(torch.tensor([prompt + [40]])).logits[0, -1]
    top2 = torch.topk(logits, 2).values
    divergence = comparer.explain(prompt, (40, 41, 42), (40, 43))
    assert divergence.position == 1
    assert abs(divergence.margin - float(top2[0] - top2[1])) < 1e-4
    assert divergence.spec_token == tokenizer.decode([41]) and divergence.other_token == tokenizer.decode([43])


def test_a_near_tie_is_judged_by_the_logits_dtype():
    from specchat.session.compare import Divergence, tie_threshold

    assert tie_threshold(20.0, torch.bfloat16) == 0.25  # bf16 holds a logit near 20 only to 0.125
    assert tie_threshold(20.0, torch.float32) == 0.05
    assert tie_threshold(0.0, torch.bfloat16) == 0.05
    in_bf16 = Divergence(3, "a", "b", margin=0.1, tie_below=tie_threshold(20.0, torch.bfloat16))
    in_float32 = Divergence(3, "a", "b", margin=0.1, tie_below=tie_threshold(20.0, torch.float32))
    assert in_bf16.near_tie and not in_float32.near_tie


def render(report, width):
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(CompareView(report))
    return out.getvalue()


def test_view_is_side_by_side_when_wide_and_stacked_when_narrow(target, similar_drafter_model, tokenizer):
    session, comparer = session_with_compare(target, similar_drafter_model, tokenizer)
    session.compare_fn = view_compare_fn(comparer)
    views = [e for e in session.reply("Hello") if isinstance(e, CompareView)]
    report = views[0].report
    wide, narrow = render(report, 140), render(report, 60)
    header = [line for line in wide.splitlines() if "target-only" in line][0]
    assert "spec" in header  # both labels on one line: columns
    assert "── spec ──" in narrow and "── target-only ──" in narrow
    assert "texts identical" in wide and "speedup" in wide
    diverged = dataclasses.replace(
        report,
        divergence=comparer.explain(session.last_prompt_ids, (40,), (41,)),
        others=(dataclasses.replace(report.target, ids=(41,)),),
    )
    assert "texts differ from token 0" in render(diverged, 140)


def test_a_compare_cancelled_mid_rerun_shows_nothing_and_keeps_the_reply(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    """Ctrl-C while the target-only rerun runs: no report (nothing fair to show), the chat's reply is
    recorded, and the next reply's compare is whole and identical."""
    import threading

    session, comparer = session_with_compare(target, similar_drafter_model, tokenizer)
    cancel = threading.Event()
    real_steps = comparer.target_engine.steps

    def cancelled_after_one_step(*args, **kwargs):
        for n, item in enumerate(real_steps(*args, **kwargs)):
            if n == 1:
                cancel.set()
            yield item

    monkeypatch.setattr(comparer.target_engine, "steps", cancelled_after_one_step)
    events = list(session.reply("Hello, how are you", cancel))
    assert cancel.is_set() and reports(events) == []
    assert [r.stop_reason for r in session.records] == ["max_tokens"]
    monkeypatch.undo()
    [report] = reports(list(session.reply("and the fox?")))
    assert report.identical


def test_the_speedup_compares_generation_not_the_reruns_reading_of_the_conversation(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    """Compare turned on late: the target-only rerun reads the whole conversation (19 s here) while the reply
    reused its cache. The speedup is generation against generation (1.11×, not the 22× the wall times give),
    each side's reading is shown apart, and the rerun's first token is timed from the end of its reading."""
    from specchat.speculative.events import ReplyEnd
    from specchat.speculative.metrics import ReplyStats
    from specchat.tui.compare_view import run_summary, verdict_line

    session, comparer = session_with_compare(target, similar_drafter_model, tokenizer)
    rerun = ReplyStats(mode="target", new_tokens=21, wall_s=20.0, ttft_s=19.1, prefill_tokens=1440, prefill_s=19.0)

    def long_read(prompt_ids, sampling, speculation, cancel=None):
        real = list(comparer_steps(prompt_ids, sampling, speculation, cancel))[-1]
        yield ReplyEnd(rerun, real.ids, real.stop_reason, real.seed)

    comparer_steps = comparer.target_engine.steps
    monkeypatch.setattr(comparer.target_engine, "steps", long_read)
    events = list(session.reply("Hello, how are you"))
    done = [e for e in events if type(e).__name__ == "ReplyDone"][0]
    done.stats.new_tokens, done.stats.wall_s, done.stats.prefill_s, done.stats.ttft_s = 21, 0.9, 0.0, 0.05
    [report] = reports(events)
    assert abs(report.speedup - (21 / 0.9) / 21.0) < 1e-9  # 1.11×; the wall times' ratio is 22×
    assert "speedup 1.11× vs target-only (generation rates, prompt reading apart)" in verdict_line(report)
    assert abs(report.saved_s - (21 / 21.0 - 0.9)) < 1e-9  # the reply's 21 tokens at the target's rate, less 0.9 s
    assert verdict_line(report).startswith("speculation saved 0.1 s on this reply · speedup 1.11×")
    assert run_summary(report.target) == (
        "21 tok · 21.0 tok/s generating · first token 0.10 s after the prompt · prompt 1,440 tok read in 19.00 s"
    )


def test_the_compare_box_colours_the_chats_reply_by_who_wrote_each_token():
    """The chat's reply in the compare view as it streamed: each token in its origin's colour (a copy apart from a
    model draft); a rerun, written by one model, plain; on a console without colour the same characters."""
    from specchat.session.compare import Run
    from specchat.speculative.events import Origin, Token
    from specchat.speculative.metrics import ReplyStats
    from specchat.tui import render

    tokens = (
        Token(1, "def", Origin.DRAFTED),
        Token(2, " f", Origin.DRAFTED, source="lookup"),
        Token(3, "():", Origin.CORRECTED),
    )
    spec = Run("spec", "def f():", (1, 2, 3), ReplyStats(new_tokens=3, wall_s=1.0), tokens)
    other = Run("target-only", "def f():", (1, 2, 3), ReplyStats(new_tokens=3, wall_s=2.0))
    report = CompareReport(spec, (other,), True, None)
    styles = [(span.start, span.end, str(span.style)) for span in render.coloured_tokens(tokens).spans]
    assert styles == [
        (0, 3, render.STYLES[Origin.DRAFTED]),
        (3, 5, render.COPIED_STYLE),
        (5, 8, render.STYLES[Origin.CORRECTED]),
    ]
    colour, plain = io.StringIO(), io.StringIO()
    Console(file=colour, width=120, force_terminal=True, color_system="standard").print(CompareView(report))
    Console(file=plain, width=120, color_system=None).print(CompareView(report))
    assert "\x1b[" in colour.getvalue() and "def f():" in plain.getvalue() and "\x1b[" not in plain.getvalue()
    mismatched = dataclasses.replace(spec, text="something else")  # tokens that do not spell the text: plain
    from specchat.tui.compare_view import reply_text

    assert reply_text(mismatched).plain == "something else" and not reply_text(mismatched).spans
    assert reply_text(spec).spans and not reply_text(other).spans
