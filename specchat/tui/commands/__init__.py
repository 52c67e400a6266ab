"""Slash-commands: one registry gives dispatch, /help and tab-completion.

A handler takes the ChatSession and the argument text and returns an Outcome. Settings change only
through specchat.config (with_value / set_from_text), so a bad value is refused with one line naming
what is allowed, and nothing changes.

The parts: registry.py (Command, Outcome, Registry, the completer), values.py (one setting shown and set),
settings.py, views.py, races.py (/compare), conversation.py and files.py (the commands of each family).
This module imports the parts; the parts never import it.
"""

from __future__ import annotations

from specchat.tui.commands.conversation import conversation_commands
from specchat.tui.commands.files import file_commands, write_free_name
from specchat.tui.commands.races import race_commands
from specchat.tui.commands.registry import Clip, Command, Outcome, Registry
from specchat.tui.commands.settings import setting_commands
from specchat.tui.commands.views import view_commands

__all__ = ["Clip", "Command", "Outcome", "Registry", "build_registry", "write_free_name"]

HELP_ORDER = (  # /help lists the commands in this order (after /help itself)
    "quit gamma temp top_k top_p legend stop min_p repeat_penalty presence_penalty greedy sample max seed "
    "mode compare drafter show stats why trace trace! system reset "
    "history retry undo edit load view copy save save! config set"
).split()


def build_registry() -> Registry:
    """Every command: the settings and views first, then the conversation's verbs and files."""
    families = (setting_commands(), view_commands(), race_commands(), conversation_commands(), file_commands())
    by_name = {command.name: command for family in families for command in family}
    if sorted(by_name) != sorted(HELP_ORDER):
        raise ValueError(f"HELP_ORDER must name each command once: {sorted(set(by_name) ^ set(HELP_ORDER))}")
    return Registry([by_name[name] for name in HELP_ORDER])
