"""The slash-command machinery: a Command, what its handler returns (an Outcome), and the Registry that gives
dispatch, /help, "did you mean" and tab-completion (SlashCompleter)."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, NestedCompleter
from prompt_toolkit.document import Document
from rich.table import Table

from specchat.config import ConfigError
from specchat.session.chat import ChatError, ChatSession
from specchat.tui import render

SUGGEST_CUTOFF = 0.6  # difflib ratio: /gama → /gamma, /comapre → /compare; not /clear → /compare or /load → /mode
OTHER_CHATS = {  # what other chats call a command specchat has under another name: described, never guessed
    "clear": "to forget the conversation: /reset, which cannot be undone",
    "new": "to forget the conversation: /reset, which cannot be undone",
    "bye": "to leave: /quit or Ctrl-D",
}
KEYS_HELP = "keys: Esc-Enter new line · Ctrl-C cancels a reply · F2 / Ctrl-T toggles compare · Ctrl-D quits"


@dataclass(frozen=True)
class Outcome:
    message: Any = None  # a str or a rich renderable
    error: bool = False
    quit: bool = False
    work: Callable[[threading.Event], Iterator[Any]] | None = None  # a long job the REPL runs after the
    # message, drawing what it yields (progress lines, then its result); Ctrl-C sets the event
    stream: Callable[[threading.Event], Iterator[Any]] | None = None  # a reply's events (/retry), drawn as a reply
    clipboard: Clip | None = None  # a block the user asked to copy (/copy): to the terminal (OSC 52), else a file
    prefill: str | None = None  # the text the next prompt starts with, to edit (/edit N)


@dataclass(frozen=True)
class Clip:
    block: Any  # reply_view.CodeBlock
    label: str  # "code block 2 of 3 (14 lines)"
    stem: str  # the file name, less its extension, where the output is not a terminal


Handler = Callable[[ChatSession, str], Outcome]


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    help: str
    handler: Handler
    complete: Any = None  # NestedCompleter value: dict, set, Completer or None
    aliases: tuple[str, ...] = ()
    destructive: bool = False  # discards state (the conversation, a reply, a file, the session): never a guess
    details: str = ""  # more, shown by /help NAME only


def fail(message: str) -> Outcome:
    return Outcome(message, error=True)


class Registry:
    def __init__(self, commands: list[Command]):
        help_command = Command(
            "help", "[COMMAND]", "list commands, or describe one", self._help, {f"{c.name}": None for c in commands}
        )
        self.commands = [help_command, *commands]
        self._by_name: dict[str, Command] = {}
        for command in self.commands:
            for name in (command.name, *command.aliases):
                self._by_name[name] = command

    def names(self) -> list[str]:
        return list(self._by_name)

    def find(self, name: str) -> Command | None:
        return self._by_name.get(name.lstrip("/").lower())

    def suggest(self, name: str) -> str | None:
        """The closest harmless command to a mistyped one: a guess that discards state is never offered."""
        harmless = [n for n in self.names() if not self._by_name[n].destructive]
        close = difflib.get_close_matches(name.lstrip("/").lower(), harmless, n=1, cutoff=SUGGEST_CUTOFF)
        return close[0] if close else None

    def run(self, session: ChatSession, line: str) -> Outcome:
        """Run one input line that starts with '/'."""
        name, _, arg = line.strip().partition(" ")
        command = self.find(name)
        if command is None:
            guess = self.suggest(name)
            hint = f" — did you mean /{guess}?" if guess else ""
            elsewhere = OTHER_CHATS.get(name.lstrip("/").lower())
            hint = f"; {elsewhere}" if elsewhere and not guess else hint
            return fail(f"unknown command {name}{hint} (/help lists every command)")
        try:
            return command.handler(session, arg.strip())
        except (ConfigError, ChatError) as err:
            return fail(f"/{command.name}: {err}")

    def _help(self, session: ChatSession, arg: str) -> Outcome:
        if not arg:
            return Outcome(render.group(self.help_table(), render.Text(KEYS_HELP)))
        command = self.find(arg)
        if command is None:
            return fail(f"/help: no command {arg} (/help lists every command)")
        line = f"/{command.name} {command.args} — {command.help}".replace("  —", " —")
        return Outcome(line + (f"\n{command.details}" if command.details else ""))

    def help_table(self) -> Table:
        rows = []
        for command in self.commands:
            names = ", ".join(f"/{n}" for n in (command.name, *command.aliases))
            rows.append((f"{names} {command.args}".rstrip(), command.help))
        return render.as_table(rows, ("command", "what it does"))

    def completion_tree(self) -> dict[str, Any]:
        return {f"/{name}": command.complete for name, command in self._by_name.items()}

    def completer(self) -> SlashCompleter:
        helps = {f"/{name}": command.help for name, command in self._by_name.items()}
        return SlashCompleter(self.completion_tree(), helps)


class SlashCompleter(Completer):
    """Completes '/name' (with its help as meta), then each command's arguments."""

    def __init__(self, tree: dict[str, Any], helps: dict[str, str]):
        self.names = list(tree)
        self.helps = helps
        self.arguments = NestedCompleter.from_nested_dict(tree)

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor.lstrip()
        if not text.startswith("/"):
            return
        if " " in text:
            yield from self.arguments.get_completions(document, complete_event)
            return
        for name in self.names:
            if name.startswith(text.lower()):
                yield Completion(name, start_position=-len(text), display_meta=self.helps.get(name, ""))
