"""The banner's expected-speed line (session/pair_cost.py): c and the step costs measured at start, and the
acceptance at which drafting starts to pay (Leviathan et al.'s speedup = 1 there)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from tinypair import loader, tiny_pair

from specchat.config import Config, SamplingConfig, SpeculationConfig
from specchat.session.pair_cost import PairCost, measured_cost
from specchat.speculative.drafters.lookup import common_prefix_len
from specchat.speculative.events import ReplyDone
from specchat.speculative.metrics import ReplyStats, leviathan_speedup
from specchat.tui import cli, render


def test_the_break_even_acceptance_is_where_the_speedup_is_one():
    cost = PairCost(target_step_s=0.040, drafter_forward_s=0.010, gamma=4)
    alpha = cost.break_even_alpha()
    assert cost.c == pytest.approx(0.25)
    assert leviathan_speedup(alpha, 4, 0.25) == pytest.approx(1.0, abs=1e-6)
    assert leviathan_speedup(alpha - 0.05, 4, 0.25) < 1.0 < leviathan_speedup(alpha + 0.05, 4, 0.25)
    assert cost.line() == (
        "expected: c 0.25 (drafter forward 10.0 ms, target step 40.0 ms); "
        f"γ 4 pays once over {alpha:.0%} of drafts are accepted ({leviathan_speedup(0.8, 4, 0.25):.1f}× at 80%)"
    )


def test_a_drafter_as_slow_as_the_target_is_told_it_cannot_pay():
    cost = PairCost(target_step_s=0.040, drafter_forward_s=0.040, gamma=4)
    assert cost.break_even_alpha() is None
    assert "drafting cannot pay" in cost.line()


def test_the_cost_comes_from_a_replys_timed_forwards_only():
    stats = ReplyStats(mode="spec", target_time_s=0.5, target_timed=4, drafter_time_s=0.125, drafter_timed=16)
    assert measured_cost(stats, 4) == PairCost(0.125, 0.0078125, 4)
    assert measured_cost(ReplyStats(mode="spec", target_time_s=0.3, target_timed=3), 4) is None


def test_the_start_times_the_pair_and_the_banner_says_it(tokenizer, target, unrelated_drafter_model, monkeypatch):
    from specchat.session import warm_up

    timed = []
    real = warm_up.measured_cost
    monkeypatch.setattr(warm_up, "measured_cost", lambda stats, gamma: timed.append(stats) or real(stats, gamma))
    pair = tiny_pair(tokenizer, target, unrelated_drafter_model)
    console = Console(file=io.StringIO())
    _, session, cost = cli.prepare(Config(), loader(pair), None, console)
    assert cost is not None and cost.gamma == 4  # γ auto: the line is about γ 4
    assert cost.target_step_s > 0 and cost.drafter_forward_s > 0
    # an unrelated drafter's drafts are rejected, a token a step: the timed reply stops after its first steps
    [stats] = timed
    assert stats.target_timed == warm_up.TIMED_STEPS and stats.new_tokens < 8 and stats.reused_tokens > 0
    assert session.messages == [] and session.records == []  # the timed reply is forgotten
    assert "\n         · expected: c " in render.banner(pair, "model", cost.line()).plain


@pytest.mark.parametrize("mode", ["spec", "target"])
def test_the_first_reply_reads_only_its_message_and_is_exact(tokenizer, target, unrelated_drafter_model, mode):
    """The warm-up's prompt cache is kept: the user's first prompt shares its system prompt and reads only the
    rest, and its greedy reply is transformers' own."""
    from conftest import hf_greedy

    pair = tiny_pair(tokenizer, target, unrelated_drafter_model)
    config = Config(sampling=SamplingConfig(max_new_tokens=12), speculation=SpeculationConfig(mode=mode))
    _, session, _ = cli.prepare(config, loader(pair), None, Console(file=io.StringIO()))
    warm = session.render([{"role": "user", "content": "Say hello."}])  # the warm-up's prompt
    [done] = [e for e in session.reply("what do foxes eat?") if isinstance(e, ReplyDone)]
    prompt = session.last_prompt_ids
    shared = common_prefix_len(warm, prompt)  # the system prompt and the user turn's opening
    assert tokenizer.decode(prompt[:shared]).startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert done.stats.reused_tokens == shared
    assert done.stats.prefill_tokens == len(prompt) - 1 - done.stats.reused_tokens
    assert list(done.ids) == hf_greedy(target, prompt, len(done.ids))


def test_no_drafter_no_line(tokenizer, target):
    pair = tiny_pair(tokenizer, target, with_drafter=False)
    config = Config(speculation=SpeculationConfig(mode="target"))
    assert cli.prepare(config, loader(pair), None, Console(file=io.StringIO()))[2] is None
