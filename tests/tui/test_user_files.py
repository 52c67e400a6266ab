"""Files the chat writes for the user are private and never clobbered by accident: transcripts and traces
are written 0600 through mkstemp (a planted symlink is never followed) and refuse an existing file unless
the command is /save! or /trace!; the input history is 0600 in a 0700 folder and stores a line with a byte
the terminal could not decode as typed, in one whole record."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest
from conftest import ScriptedEngine, scripted_reply
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from specchat.config import Config
from specchat.fileio import write_text_atomic
from specchat.session.chat import ChatSession
from specchat.speculative.events import Origin
from specchat.speculative.metrics import ReplyStats
from specchat.tui.commands import build_registry
from specchat.tui.render import Renderer, make_console
from specchat.tui.repl import Repl, open_history

NO_SUCH_USER = "nosuchuser_specchat_files"


class OneTokenTemplate:
    """A chat template of three fixed ids and a decoder; no model is needed to refuse or save."""

    def apply_chat_template(self, conversation, add_generation_prompt, tokenize, return_dict):
        return {"input_ids": [1, 2, 3]}

    def decode(self, ids) -> str:
        return "x" * len(ids)


def answered_session(replies: int = 1) -> ChatSession:
    canned = [
        scripted_reply([("Hello", Origin.TARGET)], ReplyStats(mode="target", new_tokens=1)) for _ in range(replies + 1)
    ]
    session = ChatSession(ScriptedEngine(canned), OneTokenTemplate(), Config(), 1024)
    for _ in range(replies):
        list(session.reply("hi"))
    return session


@pytest.fixture
def umask_022():
    """The usual umask, under which the old code made world-readable files."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize(
    "line, name", [("/save chat.md", "chat.md"), ("/save chat.json", "chat.json"), ("/trace t.jsonl", "t.jsonl")]
)
def test_transcripts_and_traces_are_written_0600(line, name, tmp_path, monkeypatch, umask_022):
    monkeypatch.chdir(tmp_path)
    assert not build_registry().run(answered_session(), line).error
    assert mode_of(tmp_path / name) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temp file left


def test_a_symlink_planted_at_a_guessable_temp_name_is_not_followed(tmp_path, monkeypatch):
    """The temp name was `.NAME.PID.tmp`, opened without O_EXCL: a link planted there was written through."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = [tmp_path / f".chat.md.{os.getpid()}.tmp", tmp_path / ".chat.md.tmp"]
    for link in planted:
        link.symlink_to(victim)
    assert not build_registry().run(answered_session(), "/save chat.md").error
    assert victim.read_text() == "precious\n"
    assert all(link.is_symlink() for link in planted)
    assert (tmp_path / "chat.md").read_text().startswith("# specchat transcript")


def test_write_text_atomic_refuses_an_existing_path_unless_told(tmp_path):
    path = tmp_path / "f.md"
    write_text_atomic(path, "one\n", overwrite=False)
    with pytest.raises(FileExistsError):
        write_text_atomic(path, "two\n", overwrite=False)
    assert path.read_text() == "one\n"
    write_text_atomic(path, "two\n")
    assert path.read_text() == "two\n"


def test_the_temp_file_a_killed_save_left_is_cleared_by_the_next_one(tmp_path):
    """A /save! killed between mkstemp and the rename leaves `.chat.md.XXXXXXXX.tmp`; the next write of chat.md
    removes it once it is a minute old, and leaves alone a fresh one (a write in flight), a link, another name."""
    import os

    path = tmp_path / "chat.md"
    left = tmp_path / ".chat.md.k3j_x9q2.tmp"
    fresh, other = tmp_path / ".chat.md.a1b2c3d4.tmp", tmp_path / ".notes.md.k3j_x9q2.tmp"
    for temp in (left, fresh, other):
        temp.write_text("half a transcript")
        temp.chmod(0o600)
    os.utime(left, (1_000_000, 1_000_000))
    os.utime(other, (1_000_000, 1_000_000))
    link = tmp_path / ".chat.md.zzzzzzzz.tmp"
    link.symlink_to(other)
    write_text_atomic(path, "whole\n")
    assert not left.exists() and fresh.exists() and other.exists() and link.is_symlink()
    assert path.read_text() == "whole\n"


@pytest.mark.parametrize(
    "command, name", [("save", "chat.md"), ("save", "chat.json"), ("trace", "t.jsonl"), ("trace", "all t.jsonl")]
)
def test_an_existing_file_is_refused_then_replaced_with_the_bang_form(command, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / name.split()[-1]
    path.write_text("the user's own file\n")
    registry, session = build_registry(), answered_session()
    refused = registry.run(session, f"/{command} {name}")
    assert refused.error and refused.message == (f"/{command}: {path.name} exists; use /{command}! {name} to overwrite")
    assert path.read_text() == "the user's own file\n"
    replaced = registry.run(session, f"/{command}! {name}")
    assert not replaced.error and path.read_text() != "the user's own file\n"
    if path.suffix != ".md":
        json.loads(path.read_text().splitlines()[0] if command == "trace" else path.read_text())


def test_a_symlink_at_the_target_is_refused_and_replaced_not_followed_with_the_bang(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "chat.md").symlink_to(victim)
    registry, session = build_registry(), answered_session()
    assert "exists; use /save! chat.md" in registry.run(session, "/save chat.md").message
    assert not registry.run(session, "/save! chat.md").error
    assert victim.read_text() == "precious\n" and not (tmp_path / "chat.md").is_symlink()


@pytest.mark.parametrize(
    "line",
    [
        f"/trace ~{NO_SUCH_USER}/x.jsonl",
        f"/trace! all ~{NO_SUCH_USER}/x.jsonl",
        f"/save ~{NO_SUCH_USER}/x.md",
        f"/save! ~{NO_SUCH_USER}/x.json",
    ],
)
def test_a_home_folder_of_no_such_user_is_one_line(line):
    """The expanduser of /trace sat outside its try: RuntimeError ended the chat in a traceback."""
    outcome = build_registry().run(answered_session(), line)
    assert outcome.error and "Could not determine home directory" in outcome.message
    assert "\n" not in outcome.message


def test_the_bang_forms_have_help_completion_and_suggestions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.md").write_text("")
    registry = build_registry()
    completer = registry.completer()

    def complete(text):
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("/sav") == ["/save", "/save!"] and complete("/tra") == ["/trace", "/trace!"]
    assert complete("/save! ch") == ["at.md"] and complete("/trace! ch") == ["at.md"]
    # the bang forms replace files: never a guess; the plain forms, which refuse to, are
    assert registry.suggest("/sav!") == "save" and registry.suggest("/trac!") == "trace"
    session = answered_session()
    assert registry.run(session, "/help save!").message.startswith("/save! PATH — /save, replacing PATH")
    assert "/save! PATH replaces" in registry.run(session, "/save").message


def test_the_history_file_is_0600_in_a_0700_folder(tmp_path, umask_022):
    path = tmp_path / "state" / "specchat" / "history"
    history, problem = open_history(path)
    assert problem is None
    history.append_string("my secret prompt")
    assert mode_of(path) == 0o600 and mode_of(path.parent) == 0o700
    assert "my secret prompt" in path.read_text()


def test_an_undecodable_byte_typed_at_the_prompt_is_stored_as_typed_in_one_record(tmp_path, capfd):
    """prompt_toolkit's FileHistory encoded strictly (a traceback in its event loop and a record cut after its
    header), or, in later versions, stored '?' for the byte."""
    path = tmp_path / "history"
    history, _ = open_history(path)
    out = io.StringIO()
    session = answered_session(replies=0)
    with create_pipe_input() as pipe:
        pipe.send_bytes(b"caf\xe9 au lait\rhello\r/quit\r")
        repl = Repl(
            session,
            build_registry(),
            Renderer(make_console(False, out)),
            history,
            pt_input=pipe,
            pt_output=DummyOutput(),
        )
        assert repl.run() == 0
    stored = path.read_bytes()
    assert b"\n+caf\xe9 au lait\n" in stored and b"\n+hello\n" in stored and b"\n+/quit\n" in stored
    assert stored.count(b"\n# ") == 3  # three whole records
    assert "byte that is not UTF-8 at character 4" in out.getvalue()
    assert "Unhandled exception" not in out.getvalue() + "".join(capfd.readouterr())
    assert [m["content"] for m in session.messages] == ["hello", "Hello"]
    assert list(open_history(path)[0].load_history_strings())[-1] == "caf\ufffd au lait"


def saved_transcript(tmp_path) -> dict:
    session = answered_session(2)
    assert not build_registry().run(session, f"/save {tmp_path / 'chat.json'}").error
    return json.loads((tmp_path / "chat.json").read_text())


def load_line(session: ChatSession, path) -> str:
    outcome = build_registry().run(session, f"/load {path}")
    assert outcome.error
    return str(outcome.message)


def test_load_reads_regular_files_only_and_never_blocks_on_a_fifo(tmp_path):
    fifo, zero = tmp_path / "pipe.json", tmp_path / "zero.json"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    session = answered_session()
    for path in (fifo, zero):
        assert "not a regular file" in load_line(session, path)
    assert len(session.records) == 1  # the conversation is untouched


def test_load_refuses_a_file_past_its_size_bound(tmp_path):
    big = tmp_path / "big.json"
    big.write_text('{"system": "' + "x" * (16 * 2**20) + '", "turns": []}')
    assert "larger than 16 MiB" in load_line(answered_session(), big)


def test_a_transcript_with_a_bad_stats_field_changes_nothing(tmp_path):
    data = saved_transcript(tmp_path)
    data["config"]["sampling.temperature"] = 0.5
    data["turns"][1]["stats"]["new_tokens"] = "abc"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    session = answered_session()
    before = session.config
    assert "stats field new_tokens is str" in load_line(session, bad)
    assert session.config is before and len(session.records) == 1
    data["turns"][1]["stats"]["new_tokens"] = 7
    bad.write_text(json.dumps(data))
    assert not build_registry().run(session, f"/load {bad}").error
    assert len(session.records) == 2 and session.config.sampling.temperature == 0.5
    assert not build_registry().run(session, "/stats").error  # what loads, /stats and /save can use
    assert not build_registry().run(session, f"/save {tmp_path / 'again.json'}").error
