"""Text from a model is data: a reply spelling terminal escapes (clear screen, an OSC 52 clipboard write, an
OSC 8 link, a one-character C1 CSI, BEL, DEL) reaches the screen through every view as visible escapes, so
the only escape codes written are specchat's own styling. Files: /save .md shows the same visible form;
/save .json, /trace and --json keep the exact text, every control character JSON-escaped."""

from __future__ import annotations

import io
import json
import re

import pytest
from conftest import ScriptedEngine, scripted_reply
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from specchat.config import Config
from specchat.safe_text import json_text, visible
from specchat.session.chat import ChatSession
from specchat.session.compare import CompareReport, Divergence, Run
from specchat.speculative.events import Origin, Rejected
from specchat.speculative.insight import Rejection
from specchat.speculative.metrics import ReplyStats
from specchat.tui.cli import run_once
from specchat.tui.commands import build_registry
from specchat.tui.compare_view import CompareView
from specchat.tui.render import Renderer, make_console
from specchat.tui.repl import Repl

CLEAR = "\x1b[2J"
OSC52 = "\x1b]52;c;aGk=\x07"  # write "hi" to the clipboard
OSC8 = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"  # a link whose target is hidden
C1_CSI = "\x9b2J"  # CSI as one C1 character
BELL_DEL = "\x07\x7f"
PIECES = ["\x1b", "[2J", OSC52, OSC8, C1_CSI, BELL_DEL, "[bold]not markup[/bold]"]  # token i decodes to PIECES[i]
REPLY = "".join(PIECES)
SHOWN = [
    "^[[2J",
    "^[]52;c;aGk=^G",
    "^[]8;;https://evil.example^[\\click^[]8;;^[\\",
    "\\x9b2J",
    "^G^?",
    "[bold]not markup[/bold]",
]
OWN_ESCAPES = re.compile(r"\x1b\[(?:[0-9;]*m|2K|\d*G)")  # rich's styling, and 'thinking…' erased in place
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what a terminal would act on (newline, tab aside)
STATS = ReplyStats(
    gamma=4, new_tokens=6, drafted=4, accepted=2, draft_steps=1, target_forwards=2, wall_s=0.5, ttft_s=0.1
)


class PieceTokenizer:
    """Decodes token i to PIECES[i]; the chat template is a fixed short prompt (no model needed)."""

    def apply_chat_template(self, conversation, add_generation_prompt, tokenize, return_dict):
        return {"input_ids": [len(conversation)] * 3}

    def decode(self, ids) -> str:
        return "".join(PIECES[i % len(PIECES)] for i in ids)


def rejection() -> Rejection:
    ranked = tuple((i, 0.1) for i in range(5))
    return Rejection(
        step=0,
        position=0,
        drafted=0,
        emitted=2,
        p=0.1,
        q=0.9,
        accept_p=None,
        margin=0.5,
        target_top=ranked,
        drafter_top=ranked,
    )


def injecting_reply() -> list:
    pieces = [
        ("\x1b", Origin.DRAFTED),
        ("[2J", Origin.DRAFTED),
        Rejected((0, 1), CLEAR + OSC52, rejection()),
        (OSC52, Origin.CORRECTED),
        (OSC8, Origin.DRAFTED),
        (C1_CSI + BELL_DEL, Origin.BONUS),
        ("[bold]not markup[/bold]", Origin.BONUS),
    ]
    return scripted_reply(pieces, STATS)


def injecting_compare(session, prompt_ids, done, cancel):
    """Compare output whose runs and diverging tokens spell the escapes too."""
    spec = Run("spec", REPLY, done.ids, done.stats)
    other = Run("target-only", OSC8 + CLEAR, (9,), done.stats)
    yield CompareView(CompareReport(spec, (other,), True, Divergence(0, CLEAR, OSC52, 0.01)))


def session_with_injections() -> ChatSession:
    return ChatSession(
        ScriptedEngine([injecting_reply()]), PieceTokenizer(), Config(), 1024, compare_fn=injecting_compare
    )


def screen_after(console: Console, out: io.StringIO, keys: str) -> str:
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = Repl(
            session_with_injections(),
            build_registry(),
            Renderer(console),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
        )
        assert repl.run() == 0
    return out.getvalue()


def console_for(name: str) -> tuple[Console, io.StringIO]:
    """Colour (wide: compare side by side; narrow: stacked) or plain (--no-color, a pipe)."""
    out = io.StringIO()
    if name == "plain":
        return make_console(False, out), out
    width = int(name.split("-")[1])
    return Console(
        file=out, force_terminal=True, color_system="truecolor", width=width, highlight=False, emoji=False
    ), out


@pytest.mark.parametrize("name", ["colour-160", "colour-60", "plain"])
def test_escapes_in_a_reply_reach_no_view_raw(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keys = "/show rejected on\r/compare on\rhi\r/why\r/why 1\r/history\r/save chat.md\r/quit\r"
    screen = screen_after(*console_for(name), keys)
    assert screen.count("\x1b") >= 10 if name.startswith("colour") else "\x1b" not in screen  # styles were drawn
    leftover = RAW_CONTROLS.findall(OWN_ESCAPES.sub("", screen))
    assert leftover == [], f"{name}: raw control characters reached the screen: {leftover}"
    stream = screen.split("speculation.compare = 'on'", 1)[1].split(" tok/s ", 1)[0]
    for shown in SHOWN:  # the live stream shows every piece, each in its visible form
        assert shown in OWN_ESCAPES.sub("", stream), shown
    assert '"\\u001b"' in screen  # /why quotes the drafted ESC token
    assert "saved 1 replies to chat.md" in screen
    markdown = (tmp_path / "chat.md").read_text()
    assert RAW_CONTROLS.findall(markdown) == [] and "".join(SHOWN) in markdown


def test_files_and_json_output_keep_the_exact_text_every_control_escaped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = session_with_injections()
    out = io.StringIO()
    assert run_once(session, "hi", Renderer(make_console(False, io.StringIO())), True, out) == 0
    registry = build_registry()
    for line in ("/save chat.json", "/trace t.jsonl"):
        assert not registry.run(session, line).error
    saved, traced = (tmp_path / "chat.json").read_text(), (tmp_path / "t.jsonl").read_text()
    for text in (out.getvalue(), saved, traced):
        assert RAW_CONTROLS.findall(text.replace("\n", "")) == []
    assert json.loads(out.getvalue())["text"] == REPLY
    assert json.loads(saved)["turns"][0]["reply"] == REPLY
    records = [json.loads(line) for line in traced.splitlines()]
    assert "".join(r["text"] for r in records if r["origin"] != "rejected") == REPLY


@pytest.mark.parametrize(
    "char, shown",
    [
        ("\x1b", "^["),
        ("\x00", "^@"),
        ("\x07", "^G"),
        ("\r", "^M"),
        ("\x1f", "^_"),
        ("\x7f", "^?"),
        ("\x80", "\\x80"),
        ("\x9b", "\\x9b"),
        ("\x9f", "\\x9f"),
        ("\udcff", "\ufffd"),
        ("\ud800", "\ufffd"),
    ],
)
def test_each_control_character_has_one_visible_form(char, shown):
    assert visible(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize(
    "char", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200b", "\u2060", "\ufeff", "\u2028", "\u2029", "\u180e"]
)
def test_characters_that_reorder_or_hide_text_are_shown_by_their_code(char):
    """Trojan Source: `if admin \u202e} {` reads reversed on a terminal; the view names the character instead."""
    assert visible(f"a{char}b") == f"a<U+{ord(char):04X}>b"
    escaped = json_text({"t": f"a{char}b"})
    assert char not in escaped and f"\\u{ord(char):04x}" in escaped  # JSON on a terminal: escaped, still exact
    assert json.loads(escaped)["t"] == f"a{char}b"


def test_text_without_controls_is_shown_as_it_is():
    text = "line\n\ttabbed 🦜 مرحبا e\u0301 \u00a0\u00a1 ^[ \\x1b [red]x[/red] 👨\u200d👩 می\u200cخواهم \u200f"
    assert visible(text) == text


def test_json_text_escapes_what_json_dumps_leaves_raw_and_reads_back_exactly():
    data = {"t": "\x1b[2J\x7f\x9b\x85\udcff é 🦜"}
    text = json_text(data)
    assert RAW_CONTROLS.findall(text) == [] and "\\u009b" in text and "\\udcff" in text and "é 🦜" in text
    assert json.loads(text) == data
    text.encode("utf-8")  # no lone surrogate left to fail a UTF-8 file
