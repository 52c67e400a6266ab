"""The chat survives any exception: a command or a reply that raises something nobody foresaw prints one
`error:` line (the traceback only under SPECCHAT_DEBUG=1), keeps the conversation, resets the caches, and the
next reply is exact."""

from __future__ import annotations

import io

import pytest
from conftest import make_engine, run_reply
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from specchat.config import Config, SamplingConfig
from specchat.session.chat import ChatSession
from specchat.speculative.events import Token
from specchat.tui.commands import Command, Registry, build_registry
from specchat.tui.render import Renderer, make_console
from specchat.tui.repl import DEBUG_ENV, Repl

MAX_TOKENS = 6
CONFIG = Config(sampling=SamplingConfig(max_new_tokens=MAX_TOKENS))


def crash(session, arg):
    raise ZeroDivisionError("division by zero\nsecond line of the message")


def registry_with_a_crashing_command() -> Registry:
    builtin = build_registry().commands[1:]  # the registry adds its own /help
    return Registry([Command("crash", "", "raises what no handler expects", crash), *builtin])


class EngineFailingOnce:
    """The session's engine, whose stream raises part-way through the reply numbered `failing` (1-based)."""

    def __init__(self, engine, failing: int):
        self.engine, self.failing, self.calls = engine, failing, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, *args, **kwargs):
        self.calls += 1
        for event in self.engine.stream(*args, **kwargs):
            yield event
            if self.calls == self.failing and isinstance(event, Token):
                raise RuntimeError("the device went away")


@pytest.fixture
def session(target, similar_drafter_model, tokenizer):
    engine = EngineFailingOnce(make_engine(target, similar_drafter_model, tokenizer), failing=2)
    return ChatSession(engine, tokenizer, CONFIG, model_context_limit=1024)


def chat(session, keys: str) -> str:
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = Repl(
            session,
            registry_with_a_crashing_command(),
            Renderer(make_console(False, out)),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
        )
        assert repl.run() == 0
    return out.getvalue()


def test_a_reply_and_a_command_that_raise_leave_the_chat_going(session, target, tokenizer, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    screen = chat(session, "hello there\rwrite a loop\r/crash\rwrite a loop\r/quit\r")
    errors = [line for line in screen.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: RuntimeError: the device went away (the conversation is kept and the caches were reset; "
        "SPECCHAT_DEBUG=1 shows the traceback)",
        "error: ZeroDivisionError: division by zero (the conversation is kept and the caches were reset; "
        "SPECCHAT_DEBUG=1 shows the traceback)",
    ]
    assert "Traceback" not in screen and "second line of the message" not in screen
    assert [r.user for r in session.records] == ["hello there", "write a loop"]  # the failed reply left no trace
    assert [m["content"] for m in session.messages[::2]] == ["hello there", "write a loop"]
    fresh = make_engine(target, None, tokenizer)
    _, done = run_reply(
        fresh, session.last_prompt_ids, SamplingConfig(temperature=0.0, max_new_tokens=MAX_TOKENS), mode="target"
    )
    assert tuple(t.id for t in session.records[-1].tokens) == done.ids  # the reply after the failures is exact
    assert session.records[-1].stats.reused_tokens == 0  # it read its whole prompt again: the caches were reset


def test_the_traceback_is_shown_only_under_specchat_debug(session, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    screen = chat(session, "/crash\r/quit\r")
    assert "error: ZeroDivisionError: division by zero" in screen
    assert "Traceback (most recent call last)" in screen and "second line of the message" in screen
    assert 'raise ZeroDivisionError("division by zero' in screen
