"""One setting shown as the user reads it, and set from the user's text: what every setting command shares.

Settings change only through specchat.config (with_value / set_from_text), so a bad value is refused with one
line naming what is allowed, and nothing changes.
"""

from __future__ import annotations

from typing import Any

from specchat.config import WORD_SETTINGS, show_value
from specchat.session.chat import ChatSession
from specchat.settings import get_value, set_from_text
from specchat.tui.commands.registry import Command, Outcome


def shown(key: str, value: Any) -> str:
    if key in WORD_SETTINGS:
        return show_value(key, value)
    if key == "sampling.max_new_tokens" and value == 0:
        return "off (no cap: to the end of the turn or the context window)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if isinstance(value, str) else str(value)


def apply_setting(session: ChatSession, key: str, text: str) -> Outcome:
    """Set one key from user text; the session keeps its old config if the value is bad."""
    session.config = set_from_text(session.config, key, text)
    return Outcome(f"{key} = {shown(key, get_value(session.config, key))}")


def show_or_set(session: ChatSession, name: str, key: str, args: str, arg: str) -> Outcome:
    """No argument shows the current value; an argument sets it."""
    if not arg:
        return Outcome(f"{key} is {shown(key, get_value(session.config, key))} (usage: /{name} {args})")
    return apply_setting(session, key, arg)


def setting_command(name: str, key: str, args: str, help_text: str, complete: Any = None, details: str = "") -> Command:
    def handler(session: ChatSession, arg: str) -> Outcome:
        return show_or_set(session, name, key, args, arg)

    return Command(name, args, help_text, handler, complete, details=details)
