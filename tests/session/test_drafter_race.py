"""/compare drafters: each drafter (and none) in repeated short runs on fresh caches; a winner only beyond the spread."""

from __future__ import annotations

import io
import threading

from conftest import make_engine

from specchat.config import Config, SamplingConfig, SpeculationConfig
from specchat.session.chat import ChatSession
from specchat.session.drafter_race import (
    RACE_RUNS,
    RaceRun,
    gamma_contenders,
    parse_gammas,
    race,
    race_seconds,
    winner,
)
from specchat.settings import with_value
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.model_io import kv_length
from specchat.tui.commands import build_registry
from specchat.tui.compare_view import RaceSubject, race_view
from specchat.tui.render import make_console

REPEATING = "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add(a, b):"


def session_on(target, drafter_model, tokenizer):
    config = Config(sampling=SamplingConfig(temperature=0.0, max_new_tokens=30), speculation=SpeculationConfig(gamma=3))
    return ChatSession(make_engine(target, drafter_model, tokenizer), tokenizer, config, 1024)


def contender(name: str, rates: list[float], accepted: int = 10) -> RaceRun:
    """A contender whose runs wrote 40 tokens at `rates` tok/s (no prompt reading)."""
    drafted = 20 if name != "none" else 0
    return RaceRun(
        name,
        tuple(
            ReplyStats(
                new_tokens=40,
                wall_s=40 / rate,
                drafted=drafted,
                accepted=accepted if drafted else 0,
                target_forwards=20,
            )
            for rate in rates
        ),
    )


def screen(runs, current="model", subject: RaceSubject | None = None) -> str:
    out = io.StringIO()
    make_console(False, out).print(race_view(runs, subject or RaceSubject(current=current)))
    return out.getvalue()


def test_the_race_runs_each_drafter_three_times_and_leaves_the_chat_untouched(target, similar_drafter_model, tokenizer):
    registry = build_registry()
    session = session_on(target, similar_drafter_model, tokenizer)
    assert registry.run(session, "/compare drafters").error  # no reply yet
    list(session.reply(REPEATING))
    engine = session.engine
    before = (
        list(session.messages),
        list(engine.ids),
        kv_length(engine.conversation.kv),
        engine.drafter.seen,
        len(session.records),
        session.config,
    )
    items = list(race(session, threading.Event()))
    results = [item for item in items if isinstance(item, RaceRun)]
    names = ["none", "model", "lookup", "auto", "self:1"]  # self: a quarter of 3 layers
    assert [name for name, _stats in items[: -len(results)]] == names * RACE_RUNS  # taken in turns
    assert [run.name for run in results] == names and all(len(run.runs) == RACE_RUNS for run in results)
    assert all(run.stats.new_tokens == session.records[-1].stats.new_tokens for run in results)  # greedy: one reply
    assert results[0].stats.drafted == 0 and results[1].stats.drafted > 0
    outcome = registry.run(session, "/compare drafters")
    assert not outcome.error and outcome.message.startswith(
        "racing 5 ways (none, model, lookup, auto, self:1) on the last prompt, 3 short runs each: about "
    )
    assert outcome.message.endswith(" s; Ctrl-C stops")
    stats = session.records[-1].stats  # 5 ways × 3 runs, each reading the prompt and writing the reply's tokens
    each = stats.prompt_tokens / stats.prefill_tokens_per_s + min(stats.new_tokens, 64) / stats.generation_tokens_per_s
    assert abs(race_seconds(session, 5) - 15 * each) < 1e-9
    uncapped = session.config
    session.config = with_value(session.config, "sampling.max_new_tokens", 0)  # no cap: still the reply's tokens
    assert abs(race_seconds(session, 5) - 15 * each) < 1e-9
    session.config = uncapped
    lines = list(outcome.work(threading.Event()))
    assert lines[0].startswith("  1/15 none: ") and lines[14].startswith("  15/15 self:1: ")
    cancelled = threading.Event()
    cancelled.set()
    assert list(outcome.work(cancelled)) == ["/compare drafters: cancelled; nothing changed"]
    after = (
        list(session.messages),
        list(engine.ids),
        kv_length(engine.conversation.kv),
        engine.drafter.seen,
        len(session.records),
        session.config,
    )
    assert after == before


def test_overlapping_spreads_are_a_tie_with_no_fastest_and_no_advice():
    runs = [
        contender("none", [10.0, 11.0, 12.0]),
        contender("model", [11.5, 12.5, 13.0]),
        contender("lookup", [9.0, 10.0, 11.0]),
    ]
    assert winner(runs) is None
    text = screen(runs)
    assert "◀ fastest" not in text and "/drafter" not in text
    assert "no clear winner: the fastest rates lie within each other's spread (a tie)" in text
    assert "median and min–max of 3 runs each, generation tok/s" in text
    assert "12.5" in text and "11.5–13.0" in text  # the median and the min–max


def test_a_drafter_that_accepted_nothing_never_wins_over_the_target_alone():
    """On a 13-token reply every contender ran at 0.6 tok/s; lookup accepted 0 of 12 and was crowned. Not now,
    even when its runs happen to be faster than the target alone's beyond the spread."""
    runs = [contender("none", [0.58, 0.59, 0.60]), contender("lookup", [0.70, 0.71, 0.72], accepted=0)]
    assert winner(runs) is None
    assert "◀ fastest" not in screen(runs) and "/drafter lookup" not in screen(runs)


def test_a_winner_beyond_the_spread_is_named_with_the_switch():
    runs = [
        contender("none", [10.0, 10.5, 11.0]),
        contender("model", [14.0, 15.0, 15.5]),
        contender("lookup", [18.0, 19.0, 20.0]),
    ]
    text = screen(runs, current="model")
    assert [line.split()[0] for line in text.splitlines() if "◀ fastest" in line] == ["lookup"]
    assert "fastest: lookup — switch with /drafter lookup" in text
    assert "fastest: lookup, the drafter in use" in screen(runs, current="lookup")


def test_compare_drafters_runs_in_the_repl_with_progress(target, similar_drafter_model, tokenizer):
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from specchat.tui.render import Renderer
    from specchat.tui.repl import Repl

    session = session_on(target, similar_drafter_model, tokenizer)
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text("def add(a, b): return a + b; def add(a, b):\r/compare drafters\r/quit\r")
        Repl(
            session,
            build_registry(),
            Renderer(make_console(False, out)),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
        ).run()
    text = out.getvalue()
    assert "racing 5 ways" in text and "15/15 self:1" in text and "min–max" in text
    assert len(session.records) == 1


def test_the_gamma_sweep_runs_each_gamma_greedily_and_leaves_the_chat_untouched(
    target, similar_drafter_model, tokenizer
):
    registry = build_registry()
    session = session_on(target, similar_drafter_model, tokenizer)
    assert registry.run(session, "/compare gamma").error  # no reply yet
    list(session.reply(REPEATING))
    session.config = with_value(session.config, "sampling.temperature", 0.8)  # the sweep samples greedily anyway
    before = (list(session.messages), list(session.engine.ids), len(session.records), session.config)
    ways = gamma_contenders(session, parse_gammas("1, 3 auto"))
    assert [way.name for way in ways] == ["none", "1", "3", "auto"]
    items = list(race(session, threading.Event(), ways=ways, greedy=True))
    results = [item for item in items if isinstance(item, RaceRun)]
    assert [run.name for run in results] == ["none", "1", "3", "auto"]
    texts = {run.stats.new_tokens for run in results}
    assert len(texts) == 1  # greedy: every γ wrote the same reply (as many tokens)
    assert max(run.mean_gamma for run in results[1].runs) <= 1  # γ 1 drafts one token a step
    assert results[0].stats.drafted == 0 and results[2].stats.drafted > 0
    outcome = registry.run(session, "/compare gamma 2,4")
    assert not outcome.error, outcome.message
    assert outcome.message.startswith("racing γ 2, 4 and the target alone, greedy, on the last prompt, 3 short runs")
    lines = list(outcome.work(threading.Event()))
    assert lines[0].startswith("  1/9 none: ") and lines[1].startswith("  2/9 γ 2: ")
    assert (list(session.messages), list(session.engine.ids), len(session.records), session.config) == before


def test_the_gamma_list_is_checked_before_anything_runs(target, similar_drafter_model, tokenizer):
    assert parse_gammas("") == (1, 2, 4, 6, 8, parse_gammas("auto")[0])
    assert parse_gammas("4 4 2") == (4, 2)
    registry = build_registry()
    session = session_on(target, similar_drafter_model, tokenizer)
    list(session.reply("hi"))
    for arg, said in [
        ("0", "each γ is an integer from 1 to 16 or auto, not '0'"),
        ("17", "not '17'"),
        ("fast", "not 'fast'"),
        ("1 2 3 4 5 6 7 8 9", "at most 8 γs a sweep, not 9"),
    ]:
        outcome = registry.run(session, f"/compare gamma {arg}")
        assert outcome.error and outcome.message.startswith("/compare gamma: ") and said in outcome.message


def test_a_gamma_winner_is_named_with_the_gamma_to_set():
    runs = [
        contender("none", [10.0, 10.5, 11.0]),
        contender("4", [14.0, 15.0, 15.5]),
        contender("8", [18.0, 19.0, 20.0]),
    ]
    subject = RaceSubject("γ", "4", "/gamma", "γ ")
    text = screen(runs, subject=subject)
    assert text.lstrip().startswith("γ") and "fastest: γ 8 — switch with /gamma 8" in text
    assert "fastest: γ 8, the γ in use" in screen(runs, subject=RaceSubject("γ", "8", "/gamma", "γ "))
