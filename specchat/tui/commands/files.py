"""The commands that write a file: /save, /copy (a code block, to the clipboard or a file) and /trace.

Each refuses an existing file; the bang form (/save!, /trace!) replaces it.
"""

from __future__ import annotations

from prompt_toolkit.completion import PathCompleter

from specchat.session.chat import ChatError, ChatSession
from specchat.tui.commands.registry import Clip, Command, Handler, Outcome, fail
from specchat.tui.reply_view import code_blocks
from specchat.tui.trace import write_trace
from specchat.tui.transcript import save_transcript


def save_command(overwrite: bool) -> Handler:
    """/save (refuses an existing file) or /save! (replaces it)."""

    def cmd_save(session: ChatSession, arg: str) -> Outcome:
        if not arg:
            return fail(
                f"/save{'!' if overwrite else ''}: usage /save PATH.md, PATH.txt or PATH.json "
                f"(/save! PATH replaces an existing file)"
            )
        path = save_transcript(session, arg, overwrite)
        return Outcome(f"saved {len(session.records)} replies to {path}")

    return cmd_save


def cmd_copy(session: ChatSession, arg: str) -> Outcome:
    blocks = code_blocks(session.records[-1].text) if session.records else []
    if not blocks:
        return fail("/copy: the last reply has no code block" if session.records else "/copy: no reply yet")
    first, _, rest = arg.partition(" ")
    number, path = (int(first), rest.strip()) if first.isdigit() else (1, arg.strip())
    if not 1 <= number <= len(blocks):
        return fail(f"/copy: N must be from 1 to {len(blocks)} (the last reply's code blocks)")
    block = blocks[number - 1]
    label = f"code block {number} of {len(blocks)} ({block.code.count(chr(10)) + 1} lines)"
    if path:
        return Outcome(f"wrote {label} to {write_block(block, path)}")
    return Outcome(
        f"copied {label} to the clipboard (OSC 52; where the terminal does not take it, "
        f"/copy {number} PATH writes a file)",
        clipboard=Clip(block, label, f"specchat-block-{number}"),
    )


def write_free_name(block, stem: str) -> str:
    """`block` to ./STEM.EXT, or ./STEM-2.EXT and so on where that name is taken."""
    from pathlib import Path

    for n in range(1, 1000):
        name = f"{stem}{'' if n == 1 else f'-{n}'}.{block.extension}"
        if not Path(name).exists():
            return write_block(block, name)
    raise ChatError(f"cannot find a free name like {stem}.{block.extension} here; use /copy N PATH")


def write_block(block, path_text: str) -> str:
    from pathlib import Path

    from specchat.fileio import write_text_atomic

    path = Path(path_text).expanduser()
    try:
        write_text_atomic(path, block.code + "\n", overwrite=False)
    except FileExistsError:
        raise ChatError(f"{path} exists; choose another name") from None
    except (OSError, ValueError) as err:
        raise ChatError(f"cannot write '{path_text}': {getattr(err, 'strerror', None) or err}") from None
    return str(path)


def trace_command(overwrite: bool) -> Handler:
    """/trace (refuses an existing file) or /trace! (replaces it)."""

    def cmd_trace(session: ChatSession, arg: str) -> Outcome:
        path, lines = write_trace(session, arg, overwrite)
        return Outcome(f"wrote {lines} token records to {path}")

    return cmd_trace


def file_commands() -> list[Command]:
    return [
        Command(
            "trace",
            "[all] PATH.jsonl",
            "write each token's origin, draft source, p and q as JSON lines (last reply, or all); "
            "never over an existing file",
            trace_command(False),
            PathCompleter(expanduser=True),
        ),
        Command(
            "trace!",
            "[all] PATH.jsonl",
            "/trace, replacing PATH if it exists",
            trace_command(True),
            PathCompleter(expanduser=True),
            destructive=True,
        ),
        Command(
            "copy",
            "[N] [PATH]",
            "the last reply's Nth code block (default 1) to the clipboard (OSC 52), or to PATH",
            cmd_copy,
            PathCompleter(expanduser=True),
        ),
        Command(
            "save",
            "PATH",
            "save the transcript with each reply's stats (.md or .json); never over an existing file",
            save_command(False),
            PathCompleter(expanduser=True),
        ),
        Command(
            "save!",
            "PATH",
            "/save, replacing PATH if it exists",
            save_command(True),
            PathCompleter(expanduser=True),
            destructive=True,
        ),
    ]
