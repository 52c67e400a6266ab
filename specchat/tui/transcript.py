"""`/save`: the conversation with each reply's stats, as Markdown, plain text or JSON.

Markdown shows the text as the terminal does (safe_text.visible: control characters as visible
escapes); JSON keeps it exact, every control character escaped. The file is written 0600 and never
over an existing one unless the command was `/save!`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from specchat.config import Config, ConfigError, Mode, from_wire, to_wire
from specchat.fileio import write_text_atomic
from specchat.safe_text import json_text, visible
from specchat.session.chat import CUT_MARKS, ChatError, ChatSession, ReplyRecord
from specchat.settings import as_flat_dict, problem, with_value
from specchat.speculative.metrics import ReplyStats
from specchat.tui.render import stats_line

LOAD_SKIPS = ("target", "drafter", "runtime", "speculation.extra_eos")  # read when the models load: /load keeps them
PASTE_LINES = 3  # a user message of this many line breaks or more is shown in the .md inside a code fence


def transcript(session: ChatSession) -> dict[str, Any]:
    """The session as plain data: system prompt, settings, turns with stats, totals."""
    config = {k: list(v) if isinstance(v, tuple) else to_wire(k, v) for k, v in as_flat_dict(session.config).items()}
    turns = [
        {
            "user": r.user,
            "reply": r.text,
            "cut": r.cut,
            "stop_reason": r.stop_reason,
            "stats_line": stats_line(r.stats, r.stop_reason).strip(),
            "stats": r.stats.to_dict(),
        }
        for r in session.records
    ]
    return {
        "system": session.system_prompt,
        "config": config,
        "turns": turns,
        "totals": dataclasses.asdict(session.totals),
    }


def transcript_markdown(data: dict[str, Any]) -> str:
    lines = ["# specchat transcript", "", f"**system:** {visible(data['system'])}", ""]
    for turn in data["turns"]:
        reply = visible(turn["reply"]) + ("\n```" if turn["reply"].count("```") % 2 else "")  # close a cut-off fence
        lines += [
            "## you",
            "",
            user_markdown(turn["user"]),
            "",
            "## assistant",
            "",
            reply + cut_suffix(turn),
            "",
            f"`{turn['stats_line']}`",
            "",
        ]
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
        raise ChatError(
            f"cannot save to '{path}': the name must end in .md (Markdown), .txt (plain text) or .json "
            f"(exact, and /load reopens it)"
        )
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


def load_transcript(session: ChatSession, path_text: str) -> int:
    """Reopen a `.json` transcript (/save PATH.json): its turns, system prompt and settings (those read when the
    models load stay as they are). Returns the number of turns. The file must be a regular file of at most
    LOAD_BYTES; it is read, parsed and checked whole before anything changes, so a file that cannot be used
    changes nothing."""
    path = Path(path_text).expanduser()
    if path.suffix.lower() != ".json":
        raise ChatError(f"cannot load '{path_text}': /load reads a .json transcript (/save PATH.json writes one)")
    try:
        data = json.loads(read_bounded(path, LOAD_BYTES, path_text))
    except OSError as err:
        raise ChatError(f"cannot load '{path_text}': {err.strerror or err}") from None
    except (ValueError, RecursionError) as err:
        raise ChatError(f"cannot load '{path_text}': not JSON ({str(err)[:200]})") from None
    config, turns = loaded_parts(data, path_text, session.config)
    records = [loaded_record(turn, path_text) for turn in turns]
    messages = [
        m
        for turn in turns
        for m in ({"role": "user", "content": turn["user"]}, {"role": "assistant", "content": turn["reply"]})
    ]
    session.config = config
    session.restore(messages, records)
    return len(turns)


LOAD_BYTES = 16 * 2**20  # the largest transcript /load reads


def read_bounded(path: Path, limit: int, path_text: str) -> str:
    """A regular file's text, at most `limit` bytes: never a FIFO, a device or a link to one (opened without
    blocking, checked before a byte is read), never more than the limit."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ChatError(f"cannot load '{path_text}': not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ChatError(f"cannot load '{path_text}': larger than {limit // 2**20} MiB")
    return data.decode("utf-8")


def loaded_parts(data: Any, path_text: str, config: Config) -> tuple[Config, list[dict[str, Any]]]:
    """The settings and turns of a transcript's data, checked; one ChatError line where they do not fit."""
    bad = f"cannot load '{path_text}': not a specchat transcript"
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list) or not isinstance(data.get("system"), str):
        raise ChatError(f"{bad} (it needs system and turns)")
    if not all(
        isinstance(t, dict) and isinstance(t.get("user"), str) and isinstance(t.get("reply"), str)
        for t in data["turns"]
    ):
        raise ChatError(f"{bad} (each turn needs user and reply text)")
    try:
        for key, value in dict(data.get("config") or {}).items():
            if key.split(".")[0] not in LOAD_SKIPS and key not in LOAD_SKIPS:
                config = with_value(config, key, tuple(value) if isinstance(value, list) else from_wire(key, value))
        return with_value(config, "ui.system_prompt", data["system"]), data["turns"]
    except (ConfigError, TypeError, ValueError) as err:
        raise ChatError(f"cannot load '{path_text}': {err}") from None


def loaded_record(turn: dict[str, Any], path_text: str = "") -> ReplyRecord:
    """A turn's record, its stats checked field by field against ReplyStats' own types (one ChatError line)."""
    fields = {f.name: f for f in dataclasses.fields(ReplyStats)}
    stats = {k: v for k, v in dict(turn.get("stats") or {}).items() if k in fields}
    stats["gamma"] = from_wire("speculation.gamma", stats.get("gamma", 0))  # auto is written as -1
    try:
        stats["accepted_histogram"] = {int(k): int(v) for k, v in dict(stats.get("accepted_histogram") or {}).items()}
    except (TypeError, ValueError):
        raise ChatError(f"cannot load '{path_text}': a turn's accepted_histogram is not counts") from None
    for name, value in stats.items():
        if not _fits(fields[name], value):
            raise ChatError(f"cannot load '{path_text}': a turn's stats field {name} is {type(value).__name__}")
    stats["mode"] = Mode(stats.get("mode", Mode.SPEC))
    return ReplyRecord(turn["user"], turn["reply"], ReplyStats(**stats), str(turn.get("stop_reason", "eos")))


def _fits(field: dataclasses.Field, value: Any) -> bool:
    """Whether a loaded value has the type of the stats field's default (ints where floats go)."""
    if field.name == "gamma":
        return problem("speculation.gamma", value) is None
    if field.name == "mode":
        return problem("speculation.mode", value) is None
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return isinstance(value, type(default))
