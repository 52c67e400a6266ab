"""The interactive loop: prompt_toolkit input, slash-commands, streamed replies, Ctrl-C handling.

Whatever a command or a reply raises, the chat goes on: one `error:` line (the traceback too under
SPECCHAT_DEBUG=1), the conversation kept, the caches reset so the next reply reads its prompt afresh.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import termios
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs
from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from specchat.config import Mode
from specchat.session.chat import ChatError, ChatSession
from specchat.settings import with_value
from specchat.tui import render
from specchat.tui.commands import Clip, Registry, write_free_name
from specchat.tui.reply_view import markdown_view, osc52

QUIT_HINT = "(to leave, type /quit or press Ctrl-D)"
SAVE_OFFER_FROM = 4  # replies in a chat after which Ctrl-D offers to save it
DEBUG_ENV = "SPECCHAT_DEBUG"  # =1: an unexpected error shows its traceback too


def history_path() -> Path:
    """Input history lives in the XDG state directory, e.g. ~/.local/state/specchat/history."""
    return platformdirs.user_state_path("specchat") / "history"


class PrivateFileHistory(FileHistory):
    """prompt_toolkit's FileHistory, but each entry is stored as typed, in one write, to a file created
    0600. A byte the terminal could not decode (a lone surrogate, via surrogateescape) is written back as
    that byte; prompt_toolkit's own encoder raised on it mid-record (or, in later versions, wrote '?').
    Reading back shows such a byte as U+FFFD."""

    def store_string(self, string: str) -> None:
        record = f"\n# {datetime.datetime.now()}\n" + "".join(f"+{line}\n" for line in string.split("\n"))
        fd = os.open(self.filename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as out:
            out.write(history_bytes(record))


def history_bytes(text: str) -> bytes:
    """`text` as UTF-8, undecodable input bytes as they came; any other lone surrogate as '?'."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def open_history(path: Path | None) -> tuple[History, str | None]:
    """A private file history at `path` (its folder made 0700 and the file 0600 when created here), or
    an in-memory one plus a note saying why not."""
    if path is None:
        return InMemoryHistory(), None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    except OSError as err:
        return InMemoryHistory(), f"input history is not saved: cannot write {path} ({err.strerror})"
    return PrivateFileHistory(str(path)), None


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


def failure_line(err: Exception) -> str:
    """One line for an error nobody foresaw: `error: RuntimeError: what it said (…)`."""
    lines = str(err).strip().splitlines()
    said = f": {lines[0]}" if lines else ""
    return (
        f"error: {type(err).__name__}{said} (the conversation is kept and the caches were reset; "
        f"{DEBUG_ENV}=1 shows the traceback)"
    )


def toggle_compare(session: ChatSession) -> None:
    current = session.config.speculation.compare
    session.config = with_value(session.config, "speculation.compare", "off" if current != "off" else "on")


def toolbar_text(session: ChatSession) -> str:
    """Mode, drafter and γ (spec mode only), sampling (top-k and top-p only when sampling), compare, last
    acceptance, context."""
    s, sp = session.config.sampling, session.config.speculation
    parts = [sp.mode]
    if sp.mode == Mode.SPEC:
        parts += [f"drafter {sp.drafter}", f"γ {render.gamma_text(sp.gamma)}"]
    parts += (
        ["greedy"]
        if s.is_greedy
        else [f"temp {s.temperature:g}", f"top-k {s.top_k or 'off'}", f"top-p {s.top_p:g}"]
        + ([f"min-p {s.min_p:g}"] if s.min_p else [])
    )
    parts += [f"repeat {s.repeat_penalty:g}"] if s.repeat_penalty != 1.0 else []
    parts += [f"presence {s.presence_penalty:g}"] if s.presence_penalty else []
    last = session.last_stats
    acceptance = f"{last.acceptance_rate:.0%}" if last is not None and last.drafted else "–"
    parts += [
        f"compare {sp.compare}",
        f"last acceptance {acceptance}",
        f"ctx {session.context_used}/{session.context_limit}",
        "F2 compare",
        "/help ",
    ]
    return " " + " · ".join(parts)


class Repl:
    def __init__(
        self,
        session: ChatSession,
        registry: Registry,
        renderer: render.Renderer,
        history: History | None = None,
        pt_input=None,
        pt_output=None,
        offer_save: bool | None = None,
    ):
        self.session = session
        self.registry = registry
        self.renderer = renderer
        self.pt_input, self.pt_output = pt_input, pt_output
        self.prefill = ""  # the next prompt's text to edit (/edit N), once
        # Ctrl-D after a longer chat asks whether to save it: only at a terminal, never blocking a pipe
        self.offer_save = sys.stdin.isatty() and sys.stdout.isatty() if offer_save is None else offer_save
        self.prompt = PromptSession(
            history=history or InMemoryHistory(),
            completer=registry.completer(),
            auto_suggest=AutoSuggestFromHistory(),
            key_bindings=self._key_bindings(),
            bottom_toolbar=lambda: toolbar_text(self.session),
            complete_while_typing=True,
            prompt_continuation=lambda width, line, soft: "." * (width - 1) + " ",
            input=pt_input,
            output=pt_output,
        )

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
                line, self.prefill = self.prompt.prompt("you> ", default=self.prefill), ""
            except KeyboardInterrupt:
                self.prefill = ""  # an edit given up
                self.renderer.note(QUIT_HINT)
                continue
            except EOFError:
                self.offer_to_save()
                return 0
            if not self.handle(line):
                return 0

    def offer_to_save(self) -> None:
        """On Ctrl-D after SAVE_OFFER_FROM replies not yet saved: one y/N line; y saves to a new .md here."""
        unsaved = len(self.session.records) - self.session.saved_replies
        if not self.offer_save or len(self.session.records) < SAVE_OFFER_FROM or unsaved <= 0:
            return
        path = f"specchat-{datetime.datetime.now():%Y%m%d-%H%M%S}.md"
        question = f"save this chat ({len(self.session.records)} replies) to {path} before leaving? [y/N] "
        try:
            answer = PromptSession(input=self.pt_input, output=self.pt_output).prompt(question)
        except (EOFError, KeyboardInterrupt):
            return
        if answer.strip().lower() in ("y", "yes"):
            self.command(f"/save {path}")

    def handle(self, line: str) -> bool:
        """Act on one input; False means quit."""
        text = line.strip()
        if not text:
            return True
        try:
            if text.startswith("/"):
                return self.command(text)
            self.reply(text)
        except Exception as err:  # a bug or a failure nobody foresaw: it must not end the chat
            self.recover(err)
        return True

    def recover(self, err: Exception) -> None:
        """After an unexpected error: one line (and the traceback under SPECCHAT_DEBUG=1), the
        conversation as it was, and the caches reset, since a reply may have stopped half-way."""
        self.session.drop_caches()
        self.renderer.error(failure_line(err))
        if os.environ.get(DEBUG_ENV) == "1":
            self.renderer.note("".join(traceback.format_exception(type(err), err, err.__traceback__)))

    def command(self, text: str) -> bool:
        try:
            outcome = self.registry.run(self.session, text)
            if outcome.quit:
                return False
            if outcome.error:
                self.renderer.error(outcome.message)
            elif outcome.message is not None and outcome.clipboard is None:
                self.renderer.info(outcome.message)
            if outcome.work is not None:
                self.follow(outcome.work)
            if outcome.stream is not None:
                self.reply_events(outcome.stream)
            if outcome.clipboard is not None:
                self.copy(outcome.clipboard)
            self.prefill = outcome.prefill or ""
            return True
        finally:  # the renderer follows the settings, whatever the command did
            self.renderer.show_rejected = self.session.config.ui.show_rejected
            self.renderer.origin_marks = self.session.config.ui.origin_marks
            self.renderer.set_color(self.session.config.ui.color)

    def follow(self, work) -> None:
        """Run a command's long job, drawing what it yields; Ctrl-C asks it to stop."""
        with sigint_sets(threading.Event()) as cancel, quiet_terminal(sys.stdin):
            for item in work(cancel):
                self.renderer.info(item)

    def copy(self, clip: Clip) -> None:
        """A block the user chose: to the terminal's clipboard (OSC 52); where the output is not a terminal, a file."""
        console = self.renderer.console
        if console.is_terminal:
            console.file.write(osc52(clip.block.code))
            console.file.flush()
            self.renderer.info(
                f"copied {clip.label} to the clipboard (OSC 52; where the terminal does not take "
                f"it, /copy N PATH writes a file)"
            )
        else:
            self.renderer.info(
                f"the output is not a terminal: wrote {clip.label} to {write_free_name(clip.block, clip.stem)}"
            )

    def reply(self, text: str) -> None:
        """Stream one reply; Ctrl-C cuts it after the current step and the chat goes on."""
        self.reply_events(lambda cancel: self.session.reply(text, cancel))

    def reply_events(self, events) -> None:
        """Draw a reply's events (events(cancel) yields them); then, with /view markdown, the reply as Markdown."""
        before = self.session.records[-1] if self.session.records else None
        with sigint_sets(threading.Event()) as cancel, quiet_terminal(sys.stdin):
            try:
                self.renderer.begin_reply()
                for event in events(cancel):
                    self.renderer.event(event)
            except ChatError as err:
                self.renderer.error(str(err))
            except KeyboardInterrupt:
                self.renderer.error("interrupted; the reply was discarded and the caches reset")
        answered = bool(self.session.records) and self.session.records[-1] is not before
        if answered and self.session.config.ui.view == "markdown":
            self.renderer.info(
                render.group(
                    render.Text("── as Markdown ──", style="dim"), markdown_view(self.session.records[-1].text)
                )
            )
