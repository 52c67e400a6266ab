"""`/save`: the conversation with each reply's stats, as Markdown, plain text or JSON.

Markdown shows the text as the terminal does (safe_text.visible: control characters as visible
escapes); JSON keeps it exact, every control character escaped. The file is written 0600 and never
over an existing one unless the command was `/save!`.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from specchat.config import as_flat_dict
from specchat.fileio import write_text_atomic
from specchat.session.chat import CUT_MARKS, ChatError, ChatSession
from specchat.tui.render import stats_line
from specchat.tui.safe_text import json_text, visible

PASTE_LINES = 3  # a user message of this many line breaks or more is shown in the .md inside a code fence


def transcript(session: ChatSession) -> dict[str, Any]:
    """The session as plain data: system prompt, settings, turns with stats, totals."""
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in as_flat_dict(session.config).items()}
    turns = [{"user": r.user, "reply": r.text, "cut": r.cut, "stop_reason": r.stop_reason,
              "stats_line": stats_line(r.stats, r.stop_reason).strip(), "stats": r.stats.to_dict()}
             for r in session.records]
    return {"system": session.system_prompt, "config": config, "turns": turns,
            "totals": dataclasses.asdict(session.totals)}


def transcript_markdown(data: dict[str, Any]) -> str:
    lines = ["# specchat transcript", "", f"**system:** {visible(data['system'])}", ""]
    for turn in data["turns"]:
        reply = visible(turn["reply"]) + ("\n```" if turn["reply"].count("```") % 2 else "")  # close a cut-off fence
        lines += ["## you", "", user_markdown(turn["user"]), "", "## assistant", "",
                  reply + cut_suffix(turn), "", f"`{turn['stats_line']}`", ""]
    return "\n".join(lines).rstrip()


def user_markdown(text: str) -> str:
    """A message of one or two lines as it is; a longer one (a pasted file) inside a code fence longer than
    any run of backticks in it, so Markdown shows it as it was typed."""
    shown = visible(text)
    if shown.count("\n") < PASTE_LINES:
        return shown
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", shown)), default=0))
    return f"{fence}\n{shown}\n{fence}"


def cut_suffix(turn: dict[str, Any]) -> str:
    return f" {CUT_MARKS.get(turn['stop_reason'], '✂ [cut]')}" if turn.get("cut") else ""


def transcript_plain(data: dict[str, Any]) -> str:
    """The conversation as the terminal showed it, without Markdown: `you>` turns, replies, stats lines."""
    lines = [f"system: {visible(data['system'])}", ""]
    for turn in data["turns"]:
        lines += [f"you> {visible(turn['user'])}", visible(turn["reply"]) + cut_suffix(turn), turn["stats_line"], ""]
    return "\n".join(lines).rstrip()


def save_transcript(session: ChatSession, path_text: str, overwrite: bool = False) -> Path:
    """Write the transcript as Markdown or JSON, chosen by the file extension; an existing file only
    when `overwrite` (the command was /save!)."""
    try:
        path = Path(path_text).expanduser()
    except RuntimeError as err:  # ~user when there is no such user
        raise ChatError(f"cannot save to '{path_text}': {err}") from None
    writers = {".md": transcript_markdown, ".txt": transcript_plain, ".json": lambda t: json_text(t, indent=2)}
    if path.suffix.lower() not in writers:
        raise ChatError(f"cannot save to '{path}': the name must end in .md (Markdown), .txt (plain text) or .json "
                        f"(exact, and /load reopens it)")
    try:
        write_text_atomic(path, writers[path.suffix.lower()](transcript(session)) + "\n", overwrite)
    except FileExistsError:
        raise ChatError(f"{path} exists; use /save! {path_text} to overwrite") from None
    except OSError as err:
        raise ChatError(f"cannot save to '{path}': {err.strerror or err}") from None
    except ValueError as err:  # a NUL in the name
        raise ChatError(f"cannot save to '{path_text}': {err}") from None
    session.saved_replies = len(session.records)
    return path
