"""The interactive loop: prompt_toolkit input, slash-commands, streamed replies, Ctrl-C handling."""
from __future__ import annotations

import os
import signal
import sys
import termios
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs
from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from specchat.tui import render
from specchat.session.chat import ChatError, ChatSession
from specchat.tui.commands import Registry
from specchat.config import with_value

QUIT_HINT = "(to leave, type /quit or press Ctrl-D)"


def history_path() -> Path:
    """Input history lives in the XDG state directory, e.g. ~/.local/state/specchat/history."""
    return platformdirs.user_state_path("specchat") / "history"


def open_history(path: Path | None) -> tuple[History, str | None]:
    """A FileHistory at `path`, or an in-memory one plus a note saying why not."""
    if path is None:
        return InMemoryHistory(), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError as err:
        return InMemoryHistory(), f"input history is not saved: cannot write {path} ({err.strerror})"
    return FileHistory(str(path)), None


@contextmanager
def sigint_sets(cancel: threading.Event) -> Iterator[threading.Event]:
    """While streaming, Ctrl-C (SIGINT) only sets `cancel`; the engine stops before its next step."""
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: cancel.set())
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def quiet_terminal(stream) -> Iterator[None]:
    """While a reply streams, keys typed ahead (and ^C) are not echoed into it; they wait for the prompt."""
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (AttributeError, OSError, ValueError, termios.error):
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def toggle_compare(session: ChatSession) -> None:
    current = session.config.speculation.compare
    session.config = with_value(session.config, "speculation.compare", "off" if current != "off" else "on")


def toolbar_text(session: ChatSession) -> str:
    s, sp = session.config.sampling, session.config.speculation
    temperature = "greedy" if s.is_greedy else f"temp {s.temperature:g}"
    last = session.last_stats
    acceptance = f"{last.acceptance_rate:.0%}" if last is not None and last.drafted else "–"
    drafter = f" · drafter {sp.drafter}" if sp.mode == "spec" else ""
    return (f" {sp.mode}{drafter} · γ {render.gamma_text(sp.gamma)} · {temperature} · top-k {s.top_k or 'off'} · "
            f"top-p {s.top_p:g} · compare {sp.compare} · last acceptance {acceptance} · "
            f"ctx {session.context_used}/{session.context_limit} · F2 compare · /help ")


class Repl:
    def __init__(self, session: ChatSession, registry: Registry, renderer: render.Renderer,
                 history: History | None = None, pt_input=None, pt_output=None):
        self.session = session
        self.registry = registry
        self.renderer = renderer
        self.prompt = PromptSession(
            history=history or InMemoryHistory(), completer=registry.completer(),
            auto_suggest=AutoSuggestFromHistory(), key_bindings=self._key_bindings(),
            bottom_toolbar=lambda: toolbar_text(self.session), complete_while_typing=True,
            prompt_continuation=lambda width, line, soft: "." * (width - 1) + " ",
            input=pt_input, output=pt_output)

    def _key_bindings(self) -> KeyBindings:
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        @bindings.add("c-c")
        def _interrupt(event):
            if event.current_buffer.text:
                event.current_buffer.reset()
            else:
                event.app.exit(exception=KeyboardInterrupt())

        @bindings.add("f2")
        @bindings.add("c-t")
        def _compare(event):
            toggle_compare(self.session)
            event.app.invalidate()

        return bindings

    def run(self) -> int:
        """Read lines until /quit or Ctrl-D. Returns the exit status."""
        while True:
            try:
                line = self.prompt.prompt("you> ")
            except KeyboardInterrupt:
                self.renderer.note(QUIT_HINT)
                continue
            except EOFError:
                return 0
            if not self.handle(line):
                return 0

    def handle(self, line: str) -> bool:
        """Act on one input; False means quit."""
        text = line.strip()
        if not text:
            return True
        if text.startswith("/"):
            return self.command(text)
        self.reply(text)
        return True

    def command(self, text: str) -> bool:
        outcome = self.registry.run(self.session, text)
        if outcome.quit:
            return False
        if outcome.error:
            self.renderer.error(outcome.message)
        elif outcome.message is not None:
            self.renderer.info(outcome.message)
        if outcome.work is not None:
            self.follow(outcome.work)
        self.renderer.show_rejected = self.session.config.ui.show_rejected
        self.renderer.set_color(self.session.config.ui.color)
        return True

    def follow(self, work) -> None:
        """Run a command's long job, drawing what it yields; Ctrl-C asks it to stop."""
        with sigint_sets(threading.Event()) as cancel, quiet_terminal(sys.stdin):
            for item in work(cancel):
                self.renderer.info(item)

    def reply(self, text: str) -> None:
        """Stream one reply; Ctrl-C cuts it after the current step and the chat goes on."""
        with sigint_sets(threading.Event()) as cancel, quiet_terminal(sys.stdin):
            try:
                self.renderer.begin_reply()
                for event in self.session.reply(text, cancel):
                    self.renderer.event(event)
            except ChatError as err:
                self.renderer.error(str(err))
            except KeyboardInterrupt:
                self.renderer.error("interrupted; the reply was discarded and the caches reset")
