"""SIGTERM and SIGHUP leave the chat the way Ctrl-D does: no traceback, history kept, the conventional
exit status, and files the chat writes are never left half-written."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from specchat.fileio import write_text_atomic
from specchat.tui.exits import Terminated, leave_on_signals

ROOT = Path(__file__).resolve().parents[2]

# The tiny pair, with a target forward slowed to 50 ms so a reply is still streaming when the signal lands.
DRIVER = (
    "import sys, time; sys.path.insert(0, 'tests'); from tinypair import tiny_pair, loader; "
    "from specchat.tui.cli import main; pair = tiny_pair(); "
    "pair.target.register_forward_pre_hook(lambda module, args: time.sleep(0.05)); "
    "raise SystemExit(main(sys.argv[1:], load=loader(pair)))"
)


def spawn_chat(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        COLUMNS="120",
        LINES="40",
        NO_COLOR="1",
        TERM="xterm",
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    child = pexpect.spawn(
        sys.executable,
        ["-c", DRIVER, "sampling.max_new_tokens=600"],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 120),
    )
    child.expect("you>")
    return pexpect, child


def leave_by(pexpect, child, signum) -> str:
    child.kill(signum)
    child.expect(pexpect.EOF)
    child.close()
    return child.before


# Each case spawns the chat in a pty (seconds each): SIGTERM at the prompt is slow, as SIGHUP at the prompt
# and SIGTERM mid-reply (below) run the same handlers in the fast default.
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGHUP])
def test_a_signal_at_the_prompt_leaves_quietly_with_the_history_saved(tmp_path, signum):
    pexpect, child = spawn_chat(tmp_path)
    child.send("/gamma 2\r")
    child.expect("speculation.gamma = 2")
    child.send("half a line, never sent")
    screen = leave_by(pexpect, child, signum)
    assert "Traceback" not in screen and "Error" not in screen
    assert child.exitstatus == 128 + signum and child.signalstatus is None
    history = (tmp_path / "state" / "specchat" / "history").read_text()
    assert "/gamma 2" in history and "never sent" not in history


def test_sigterm_in_the_middle_of_a_reply_leaves_quietly(tmp_path):
    pexpect, child = spawn_chat(tmp_path)
    child.send("tell me a story\r")
    child.expect_exact("\x1b[?2004l")  # the prompt has handed the terminal over to the reply
    child.expect(".")  # and the reply is streaming (each step takes 50 ms or more)
    screen = leave_by(pexpect, child, signal.SIGTERM)
    assert "Traceback" not in screen
    assert " tok/s · " not in screen  # it left mid-reply, before any stats line
    assert child.exitstatus == 128 + signal.SIGTERM
    assert "tell me a story" in (tmp_path / "state" / "specchat" / "history").read_text()


def test_the_handlers_raise_in_the_main_thread_and_are_put_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as caught, leave_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0) if hasattr(signal, "sigtimedwait") else None
    assert caught.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "chat.md"
    path.write_text("the old transcript\n")

    def signalled_before_the_rename(fd):
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(os, "fsync", signalled_before_the_rename)
    with pytest.raises(Terminated):
        write_text_atomic(path, "the new transcript\n" * 1000)
    monkeypatch.undo()
    assert path.read_text() == "the old transcript\n"
    assert [p.name for p in tmp_path.iterdir()] == ["chat.md"]
    write_text_atomic(path, "the new transcript\n")
    assert path.read_text() == "the new transcript\n"


class RaisesWhenCollected:
    """Stands for a signal landing in a `__del__`, where Python only reports what is raised."""

    def __del__(self):
        raise Terminated(signal.SIGTERM)


def test_a_signal_swallowed_in_a_finalizer_is_sent_again_and_leaves():
    before = sys.unraisablehook
    with pytest.raises(Terminated) as caught, leave_on_signals():
        RaisesWhenCollected()  # collected at once: its __del__ raises, Python swallows it
        time.sleep(5)  # the signal sent again lands here
    assert caught.value.exit_status == 143
    assert sys.unraisablehook is before
