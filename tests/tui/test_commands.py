"""Slash-commands: parsing, validation (bad values change nothing), help and completion from the registry."""

from __future__ import annotations

import io

import pytest
from conftest import ScriptedEngine, make_engine, scripted_reply
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from rich.console import Console

from specchat.config import AUTO, RANDOM, Config, SamplingConfig, UIConfig
from specchat.safe_text import visible
from specchat.session.chat import ChatSession, Notice
from specchat.settings import all_keys, with_value
from specchat.speculative.events import Origin
from specchat.speculative.metrics import ReplyStats
from specchat.tui.commands import Command, Outcome, Registry, build_registry


@pytest.fixture
def session(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    return ChatSession(engine, tokenizer, Config(sampling=SamplingConfig(max_new_tokens=4)), 1024)


@pytest.fixture
def registry():
    return build_registry()


def plain(renderable) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


@pytest.mark.parametrize(
    "line, key, value",
    [
        ("/gamma 6", "speculation.gamma", 6),
        ("/gamma auto", "speculation.gamma", AUTO),
        ("/gamma 0", "speculation.gamma", 0),
        ("/temp 0.7", "sampling.temperature", 0.7),
        ("/top_k 40", "sampling.top_k", 40),
        ("/top_p 0.9", "sampling.top_p", 0.9),
        ("/max 64", "sampling.max_new_tokens", 64),
        ("/max off", "sampling.max_new_tokens", 0),
        ("/seed 7", "sampling.seed", 7),
        ("/seed random", "sampling.seed", RANDOM),
        ("/mode target", "speculation.mode", "target"),
        ("/mode drafter", "speculation.mode", "drafter"),
        ("/compare on", "speculation.compare", "on"),
        ("/compare drafter", "speculation.compare", "drafter"),
        ("/show rejected on", "ui.show_rejected", True),
        ("/system You are terse.", "ui.system_prompt", "You are terse."),
        ("/set sampling.top_k 5", "sampling.top_k", 5),
        ("/set sampling.top_k=6", "sampling.top_k", 6),
        ("/set ui.context_limit 512", "ui.context_limit", 512),
        ("/set speculation.compare on", "speculation.compare", "on"),
        ("/GAMMA 3", "speculation.gamma", 3),
    ],
)
def test_good_values_are_applied(session, registry, line, key, value):
    outcome = registry.run(session, line)
    assert not outcome.error, outcome.message
    section, name = key.split(".")
    assert getattr(getattr(session.config, section), name) == value


@pytest.mark.parametrize(
    "line, message",
    [
        ("/gamma 17", "/gamma: speculation.gamma must be an integer from 0 to 16, or auto, got 17"),
        ("/gamma many", "/gamma: speculation.gamma must be an integer from 0 to 16 or auto, got 'many'"),
        ("/gamma -2", "/gamma: speculation.gamma must be an integer from 0 to 16, or auto, got -2"),
        ("/temp -1", "/temp: sampling.temperature must be a number from 0 to 5 (0 = greedy), got -1.0"),
        ("/temp hot", "/temp: sampling.temperature must be a number, got 'hot'"),
        ("/top_k -3", "/top_k: sampling.top_k must be an integer from 0 to 1000000, got -3"),
        ("/top_p 1.5", "/top_p: sampling.top_p must be a number in (0, 1], got 1.5"),
        (
            "/max -1",
            "/max: sampling.max_new_tokens must be 0 (no cap: to the end of the turn or the context window) "
            "or a number of tokens up to 1000000, got -1",
        ),
        ("/seed soon", "/seed: sampling.seed must be an integer or random, got 'soon'"),
        ("/mode fast", "/mode: speculation.mode must be one of spec, target, drafter, got 'fast'"),
        ("/compare maybe", "/compare: speculation.compare must be one of off, on, drafter, got 'maybe'"),
        ("/show rejected maybe", "/show rejected: must be on or off, got 'maybe'"),
        ("/show accepted on", "/show: usage /show rejected on|off"),
        ("/set sampling.tempature 1", "/set: unknown key 'sampling.tempature' (did you mean 'temperature'?)"),
        ("/set nothing", "/set: usage /set section.key VALUE"),
        ("/set target.dtype float32", "/set: target.dtype is read once, when the models load; restart with"),
        ("/set speculation.extra_eos </s>", "/set: speculation.extra_eos is read once, when the models load"),
        ("/set speculation.mode fast", "/set: speculation.mode must be one of spec, target, drafter, got 'fast'"),
        (
            "/save notes.doc",
            "/save: cannot save to 'notes.doc': the name must end in .md (Markdown), .txt (plain text) "
            "or .json (exact, and /load reopens it)",
        ),
        ("/save", "/save: usage /save PATH.md, PATH.txt or PATH.json (/save! PATH replaces an existing file)"),
        ("/seed banana", "/seed: sampling.seed must be an integer or random, got 'banana'"),
        ("/gama 3", "unknown command /gama — did you mean /gamma? (/help lists every command)"),
        ("/xyzzy", "unknown command /xyzzy (/help lists every command)"),
    ],
)
def test_bad_input_gets_one_line_and_changes_nothing(session, registry, line, message):
    before = session.config
    outcome = registry.run(session, line)
    assert outcome.error
    assert outcome.message.startswith(message)
    assert "\n" not in outcome.message
    assert session.config == before


def test_no_argument_shows_the_current_value(session, registry):
    assert registry.run(session, "/gamma").message == "speculation.gamma is 4 (usage: /gamma N|auto)"
    assert registry.run(session, "/seed").message.startswith("sampling.seed is 0")
    assert "You are a helpful assistant." in registry.run(session, "/system").message


def test_temp_greedy_and_sample_work_together(session, registry):
    registry.run(session, "/greedy")
    assert session.config.sampling.is_greedy and session.config.sampling.greedy
    registry.run(session, "/temp 0.8")
    assert not session.config.sampling.is_greedy and session.config.sampling.temperature == 0.8
    registry.run(session, "/temp 0")
    assert session.config.sampling.is_greedy
    assert registry.run(session, "/sample").message.startswith("sampling at temperature 0.7")
    assert not session.config.sampling.is_greedy


def test_mode_needing_a_drafter_is_refused_without_one(target, tokenizer, registry):
    alone = ChatSession(make_engine(target, None, tokenizer), tokenizer, Config(), 1024)
    outcome = registry.run(alone, "/mode spec")
    assert outcome.error and "needs a drafter model" in outcome.message
    assert not registry.run(alone, "/mode target").error
    assert registry.run(alone, "/compare drafter").error
    assert not registry.run(alone, "/compare on").error


def test_context_limit_above_the_loaded_one_says_it_is_capped(session, registry):
    outcome = registry.run(session, "/set ui.context_limit 4096")
    assert outcome.message == "ui.context_limit = 4096 (capped at 1024, the limit the models were loaded with)"
    assert session.context_limit == 1024


def test_quit_and_exit(session, registry):
    assert registry.run(session, "/quit").quit
    assert registry.run(session, "/exit").quit
    assert not registry.run(session, "/help").quit


def test_help_lists_every_registered_command(session, registry):
    text = plain(registry.run(session, "/help").message)
    for command in registry.commands:
        assert f"/{command.name}" in text and command.help[:30] in text
    assert "/quit, /exit" in text and "Esc-Enter" in text
    assert registry.run(session, "/help gamma").message.startswith("/gamma N|auto — drafted tokens")


def test_help_and_completion_follow_the_registry(session):
    def greet(session, arg):
        return Outcome(f"hello {arg}")

    registry = Registry([Command("greet", "NAME", "say hello", greet, {"world": None}, aliases=("hi",))])
    assert registry.run(session, "/hi you").message == "hello you"
    assert "/greet, /hi NAME" in plain(registry.help_table())
    assert set(registry.completion_tree()) == {"/help", "/greet", "/hi"}
    completer = registry.completer()
    words = [c.text for c in completer.get_completions(Document("/gr"), CompleteEvent())]
    assert words == ["/greet"]
    words = [c.text for c in completer.get_completions(Document("/greet w"), CompleteEvent())]
    assert words == ["world"]


def test_builtin_completion_values(registry):
    completer = registry.completer()

    def complete(text):
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("/mo") == ["/mode"]
    assert complete("/mode ") == ["spec", "target", "drafter"]
    assert complete("/show rejected ") == ["on", "off"]
    assert "auto" in complete("/gamma ")
    assert set(complete("/set ")) == set(all_keys())


def test_config_lists_every_setting(session, registry):
    text = plain(registry.run(session, "/config").message)
    for key in all_keys():
        assert key in text
    assert "0/1024 tokens used" in text


def test_stats_history_reset_and_save(session, registry, tmp_path):
    assert registry.run(session, "/stats").message == "no reply yet: /stats describes the last reply"
    list(session.reply("hello"))
    assert "accepted length per step" in plain(registry.run(session, "/stats").message)
    assert "hello" in plain(registry.run(session, "/history").message)
    assert "[cut]" not in plain(registry.run(session, "/history").message)
    session.records[-1].stop_reason = "cancelled"
    assert f"{visible(session.records[-1].text)} ✂ [cut]" in plain(registry.run(session, "/history").message)
    session.records[-1].stop_reason = "max_tokens"  # the /max cap cut it: marked too, here and in the saved file
    assert f"{visible(session.records[-1].text)} ✂ [cut: /max reached]" in plain(
        registry.run(session, "/history").message
    )
    path = tmp_path / "t.md"
    assert registry.run(session, f"/save {path}").message == f"saved 1 replies to {path}"
    text = path.read_text()
    assert "## you\n\nhello" in text and " tok/s · ttft " in text and "✂ [cut: /max reached]" in text
    assert registry.run(session, "/reset").message.startswith("conversation cleared")
    assert session.messages == [] and session.engine.ids == []
    assert session.totals.replies == 1
    unwritable = registry.run(session, f"/save {tmp_path}/missing/dir/t.json")
    assert unwritable.error and "No such file or directory" in unwritable.message


def test_history_marks_the_cut_reply_after_older_turns_were_dropped(tokenizer, registry):
    turns = (("one", "first answer", "eos"), ("two", "second answer", "cancelled"), ("three", "third answer", "eos"))
    replies = [
        scripted_reply([(answer, Origin.TARGET)], ReplyStats(mode="target", new_tokens=1), stop)
        for _, answer, stop in turns
    ]
    # 100 tokens minus 16 for the reply: two turns fit (82 prompt tokens), three (114) do not
    config = Config(sampling=SamplingConfig(max_new_tokens=16), ui=UIConfig(context_limit=100))
    session = ChatSession(ScriptedEngine(replies), tokenizer, config, model_context_limit=1024)
    notices = [e.text for user, _, _ in turns for e in session.reply(user) if isinstance(e, Notice)]
    assert notices == ["context full: dropped the oldest turn to fit 100 tokens"]
    assert plain(registry.run(session, "/history").message).splitlines() == [
        "role       message                     ",
        "system     You are a helpful assistant.",
        "user 1     two                         ",
        "assistant  second answer ✂ [cut]       ",
        "user 2     three                       ",
        "assistant  third answer                ",
    ]


def test_set_keeps_an_equals_sign_inside_the_value(session, registry):
    assert registry.run(session, "/set ui.system_prompt use a=b").message == "ui.system_prompt = 'use a=b'"
    assert session.config.ui.system_prompt == "use a=b"
    registry.run(session, "/set ui.system_prompt=x = y")
    assert session.config.ui.system_prompt == "x = y"


def test_mode_change_shows_the_new_legend(session, registry):
    text = plain(registry.run(session, "/mode target").message)
    assert text.startswith("speculation.mode = 'target'\nlegend: target-only")
    assert "legend: drafter-only" in plain(registry.run(session, "/mode drafter").message)


@pytest.mark.parametrize(
    "on, off, key, values",
    [
        ("/compare on", "/compare off", "speculation.compare", ("on", "off")),
        ("/compare drafter", "/compare off", "speculation.compare", ("drafter", "off")),
        ("/show rejected on", "/show rejected off", "ui.show_rejected", (True, False)),
        ("/seed 7", "/seed random", "sampling.seed", (7, RANDOM)),
    ],
)
def test_switching_off_undoes_switching_on(session, registry, on, off, key, values):
    section, name = key.split(".")
    for line, value in zip((on, off), values):
        outcome = registry.run(session, line)
        assert not outcome.error, outcome.message
        assert getattr(getattr(session.config, section), name) == value


def typos(word: str) -> set[str]:
    """Every one-letter deletion, transposition and substitution of `word`."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = {word[:i] + word[i + 1 :] for i in range(len(word))}
    out |= {word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(len(word) - 1)}
    out |= {word[:i] + c + word[i + 1 :] for i in range(len(word)) for c in letters}
    return out - {word}


def test_did_you_mean_never_guesses_a_command_that_discards_state(registry):
    destructive = {name for name in registry.names() if registry.find(name).destructive}
    assert {"reset", "quit", "exit", "save!", "trace!"} <= destructive
    for word in {t for name in registry.names() for t in typos(name)} | {"clear", "retry", "load", "rest", "new"}:
        if registry.find(word) is None:
            assert registry.suggest(word) not in destructive, word


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "/clear",
            "unknown command /clear; to forget the conversation: /reset, which cannot be undone "
            "(/help lists every command)",
        ),
        ("/rest", "unknown command /rest (/help lists every command)"),
        ("/comapre on", "unknown command /comapre — did you mean /compare? (/help lists every command)"),
    ],
)
def test_unknown_commands_get_a_harmless_guess_or_none(session, registry, line, message):
    outcome = registry.run(session, line)
    assert outcome.error and outcome.message == message


def test_help_gamma_explains_alpha_and_c(session, registry):
    text = registry.run(session, "/help gamma").message
    assert text.startswith("/gamma N|auto — drafted tokens per step")
    assert "α: the chance the target accepts one draft" in text and "c: one drafter forward's time" in text


def test_stop_adds_lists_and_drops_stop_texts(session, registry):
    assert "stop texts: none" in registry.run(session, "/stop").message
    assert registry.run(session, "/stop ###").message == "a reply ends before '###'"
    assert not registry.run(session, "/stop END OF ANSWER").error
    assert session.config.sampling.stop == ("###", "END OF ANSWER")
    assert "'###', 'END OF ANSWER'" in registry.run(session, "/stop").message
    too_long = registry.run(session, "/stop " + "x" * 201)
    assert too_long.error and too_long.message.startswith("/stop: sampling.stop must be at most 8 texts of 1 to 200")
    assert registry.run(session, "/stop off").message == "no stop texts" and session.config.sampling.stop == ()


def test_stats_draws_the_expected_speedup_by_gamma_from_what_the_session_measured(session, registry):
    """The γ curve: Leviathan's formula with this session's α, c and row cost, as auto γ plans (gamma_curve), one
    row per γ 1..16, auto's pick and the γ set marked; its inputs named, the unmeasured ones said to be so."""
    from specchat.speculative.gamma import AutoGamma, gamma_curve
    from specchat.speculative.metrics import leviathan_speedup

    policy = AutoGamma()
    fresh = gamma_curve(policy)
    assert not fresh.measured and fresh.row_cost is None and fresh.cost == 0.25
    assert fresh.speedups[3] == leviathan_speedup(0.75, 4, 0.25) and len(fresh.speedups) == 16
    for rows, seconds in [(1, 0.10), (5, 0.14), (1, 0.10), (9, 0.18)]:
        policy.observe_cost("target", seconds)
        policy.target_rows.observe(rows, seconds)
    policy.observe_cost("drafter", 0.02)
    curve = gamma_curve(policy)
    assert curve.measured and abs(curve.row_cost - 0.1) < 1e-6 and abs(curve.cost - 0.2) < 1e-6
    assert curve.best == policy.best_gamma() == max(range(1, 17), key=lambda g: curve.speedups[g - 1])
    list(session.reply("hello"))
    session.engine.use_policy(policy)
    session.config = with_value(session.config, "speculation.gamma", 3)
    text = plain(registry.run(session, "/stats").message)
    assert "expected speedup by γ" in text
    assert "from this session's α 0.75 per draft · c 0.20 · a verified row +10% of a step; /compare gamma" in text
    lines = [line for line in text.splitlines() if line.startswith("γ ") and "×" in line]
    assert len(lines) == 16 and f"{curve.speedups[2]:.2f}× ◀ set" in lines[2]
    assert "◀ auto picks" in lines[curve.best - 1]
    session.engine.use_policy(AutoGamma())
    assert "c 0.25, a prior: not measured yet · row cost not measured yet" in plain(
        registry.run(session, "/stats").message
    )


def test_edit_answers_a_changed_message_in_place_of_the_later_turns(session, registry):
    """/edit N TEXT: the exchanges from message N on are dropped and TEXT answered there; /edit N alone offers the
    message to edit; a cancelled edit puts the conversation back; the reply equals one to the edited chat afresh."""
    import threading

    list(session.reply("first"))
    list(session.reply("second"))
    list(session.reply("third"))
    assert "user 2" in plain(registry.run(session, "/history").message)
    offer = registry.run(session, "/edit 2")
    assert not offer.error and offer.prefill == "/edit 2 second"
    assert "(the later exchange will be dropped;" in offer.message
    for bad, said in [("/edit", "there are 3"), ("/edit 4 x", "no message 4"), ("/edit x", "/edit N [TEXT]")]:
        outcome = registry.run(session, bad)
        assert outcome.error and said in outcome.message, outcome.message
    before = (list(session.messages), list(session.records))
    cancelled = threading.Event()
    cancelled.set()
    list(registry.run(session, "/edit 2 changed").stream(cancelled))
    assert (session.messages, session.records) == before  # nothing answered: the chat as it was
    edit = registry.run(session, "/edit 2 changed")
    assert edit.message == "answering your edited message 2 (the later exchange is dropped)"
    list(edit.stream(threading.Event()))
    assert [m["content"] for m in session.messages if m["role"] == "user"] == ["first", "changed"]
    assert len(session.records) == 2 and session.records[-1].user == "changed"
    edited_reply = session.messages[-1]["content"]
    session.messages, session.records = session.messages[:2], session.records[:1]
    session.drop_caches()
    list(session.reply("changed"))
    assert session.messages[-1]["content"] == edited_reply  # greedy: the same as answering the edited chat afresh
