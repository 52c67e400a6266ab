"""The conversation's verbs: /system, /reset, /history, /retry, /undo, /edit, /load, and /quit."""

from __future__ import annotations

from prompt_toolkit.completion import PathCompleter

from specchat.safe_text import visible
from specchat.session.chat import ChatSession
from specchat.settings import with_value
from specchat.tui import render
from specchat.tui.commands.registry import Command, Outcome, fail
from specchat.tui.transcript import load_transcript


def cmd_quit(session: ChatSession, arg: str) -> Outcome:
    return Outcome(quit=True)


def cmd_system(session: ChatSession, arg: str) -> Outcome:
    if not arg:
        return Outcome(f"system prompt: {session.system_prompt!r} (usage: /system TEXT)")
    session.config = with_value(session.config, "ui.system_prompt", arg)
    return Outcome("system prompt set; it applies from the next reply")


def cmd_reset(session: ChatSession, arg: str) -> Outcome:
    session.reset()
    return Outcome("conversation cleared (settings and session totals kept)")


def cmd_history(session: ChatSession, arg: str) -> Outcome:
    if not session.messages:
        return Outcome("no messages yet")
    cut = [r.cut_mark for r in session.records]
    rows = [("system", session.system_prompt)]
    # the records keep every reply; the messages lost the oldest turns dropped for context
    assistant_index = len(cut) - sum(1 for m in session.messages if m["role"] == "assistant")
    number = 0
    for message in session.messages:
        text, role = message["content"], message["role"]
        if role == "assistant":
            text += f" {cut[assistant_index]}" if cut[assistant_index] else ""
            assistant_index += 1
        else:
            number += 1
            role = f"user {number}"  # what /edit N takes
        rows.append((role, text))
    return Outcome(render.as_table(rows, ("role", "message")))


def cmd_undo(session: ChatSession, arg: str) -> Outcome:
    record, _pair = session.undo()
    return Outcome(
        f"dropped the last exchange ({visible(record.user)[:40]!r} and its reply); {len(session.records)} left"
    )


def cmd_retry(session: ChatSession, arg: str) -> Outcome:
    if not session.records or not session.messages or session.messages[-1]["role"] != "assistant":
        return fail("/retry: no reply to retry yet")
    sampling = session.config.sampling
    seed = "greedy: the same tokens unless a setting changed" if sampling.is_greedy else "a fresh seed"
    return Outcome(f"answering the last message again ({seed})", stream=session.retry)


def cmd_edit(session: ChatSession, arg: str) -> Outcome:
    number_text, _, text = arg.partition(" ")
    messages = session.user_messages()
    if not number_text.isdigit():
        usage = "/edit N [TEXT]: change your message N (numbered in /history) and answer it again"
        return fail(f"{usage}; there are {len(messages)}" if messages else f"{usage}; no message yet")
    number = int(number_text)
    if not 1 <= number <= len(messages):
        return fail(f"/edit: no message {number}: the conversation has {len(messages)} (see /history)")
    later = len(messages) - number
    exchanges = "the later exchange" if later == 1 else f"the {later} later exchanges"
    if not text.strip():
        dropped = f"{exchanges} will be dropped" if later else "it is the last"
        return Outcome(
            f"editing message {number}: change it and press Enter ({dropped}; Ctrl-C leaves the chat as it is)",
            prefill=f"/edit {number} {messages[number - 1]}",
        )
    said = f"{exchanges} {'is' if later == 1 else 'are'} dropped" if later else "it was the last"
    return Outcome(
        f"answering your edited message {number} ({said})",
        stream=lambda cancel: session.edit(number, text.strip(), cancel),
    )


def cmd_load(session: ChatSession, arg: str) -> Outcome:
    if not arg:
        return fail("/load: usage /load PATH.json (a transcript /save PATH.json wrote)")
    turns = load_transcript(session, arg)
    return Outcome(
        f"loaded {turns} exchanges, the system prompt and the settings from {arg}; "
        f"the next reply reads the whole conversation"
    )


def conversation_commands() -> list[Command]:
    return [
        Command("quit", "", "leave specchat (also Ctrl-D)", cmd_quit, aliases=("exit",), destructive=True),
        Command("system", "TEXT", "set the system prompt (no text: show it)", cmd_system),
        Command("reset", "", "forget the conversation", cmd_reset, destructive=True),
        Command("history", "", "show the conversation", cmd_history),
        Command(
            "retry",
            "",
            "answer the last message again with the current settings (a fresh seed when sampling)",
            cmd_retry,
            destructive=True,
        ),
        Command("undo", "", "drop the last exchange (your message and its reply)", cmd_undo, destructive=True),
        Command(
            "edit",
            "N [TEXT]",
            "change your message N (numbered in /history) and answer it again; the exchanges after it are dropped",
            cmd_edit,
            destructive=True,
        ),
        Command(
            "load",
            "PATH.json",
            "reopen a saved .json transcript: the conversation, system prompt and settings",
            cmd_load,
            PathCompleter(expanduser=True),
            destructive=True,
        ),
    ]
