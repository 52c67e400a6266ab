"""How loading reports progress (progress.py): a plain stream shows each message once."""

from __future__ import annotations

from specchat.progress import each_message_once, to_stderr


def test_a_plain_stream_shows_each_message_once():
    shown = []
    progress = each_message_once(shown.append)
    for fraction in (0.1, 0.5, 1.0):
        progress("checking target.gguf", fraction)
    progress("loading the target", None)
    progress("checking target.gguf", None)  # a message that comes back is new again
    assert shown == ["checking target.gguf", "loading the target", "checking target.gguf"]


def test_to_stderr_writes_each_new_message_to_standard_error_only(capsys):
    progress = to_stderr()
    progress("loading the target", 0.5)
    progress("loading the target", 1.0)
    progress("the target's reply to prompt 1 of 2")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "loading the target\nthe target's reply to prompt 1 of 2\n"
