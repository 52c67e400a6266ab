"""A scripted REPL session with prompt_toolkit pipe input: prompt, commands, errors, cancel, /save, /quit."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
from conftest import ScriptedEngine, make_engine, scripted_reply
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from specchat.config import RANDOM, Config, SamplingConfig
from specchat.session.chat import ChatSession
from specchat.settings import with_value
from specchat.speculative.events import Origin, Rejected, Token
from specchat.speculative.metrics import ReplyStats
from specchat.tui.commands import build_registry
from specchat.tui.render import Renderer, make_console
from specchat.tui.repl import QUIT_HINT, Repl, open_history, toggle_compare, toolbar_text

CONFIG = Config(sampling=SamplingConfig(max_new_tokens=12))


class CancellingRenderer(Renderer):
    """Presses Ctrl-C (a real SIGINT) as soon as the first token of a reply is drawn."""

    def __init__(self, console, cancel_on_reply: int):
        super().__init__(console)
        self.cancel_on_reply = cancel_on_reply
        self.replies_seen = 0
        self.tokens_this_reply = 0

    def event(self, event):
        if isinstance(event, Token):
            self.tokens_this_reply += 1
            if self.tokens_this_reply == 1:
                self.replies_seen += 1
                if self.replies_seen == self.cancel_on_reply:
                    os.kill(os.getpid(), signal.SIGINT)
        else:
            self.tokens_this_reply = 0 if type(event).__name__ == "ReplyDone" else self.tokens_this_reply
        super().event(event)


@pytest.fixture
def session(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    return ChatSession(engine, tokenizer, CONFIG, model_context_limit=1024)


def run_script(session, keys: str, renderer_factory=None):
    out = io.StringIO()
    console = make_console(False, out)
    renderer = renderer_factory(console) if renderer_factory else Renderer(console)
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = Repl(session, build_registry(), renderer, InMemoryHistory(), pt_input=pipe, pt_output=DummyOutput())
        status = repl.run()
    return status, out.getvalue()


def test_scripted_session(session, tmp_path):
    saved = tmp_path / "chat.json"
    keys = (
        "hello there\r"
        "/gamma 2\r"
        "/gama 3\r"
        "/temp 9\r"
        "/top_k 40\r"
        "/mode sideways\r"
        "/show rejected on\r"
        "write a loop\r"
        "/stats\r"
        f"/save {saved}\r"
        "/quit\r"
        "never reached\r"
    )
    status, text = run_script(session, keys, lambda c: CancellingRenderer(c, cancel_on_reply=2))
    assert status == 0
    assert "speculation.gamma = 2" in text
    assert "unknown command /gama — did you mean /gamma?" in text
    assert "/temp: sampling.temperature must be a number from 0 to 5 (0 = greedy), got 9.0" in text
    assert "sampling.top_k = 40" in text
    assert "/mode: speculation.mode must be one of spec, target, drafter, got 'sideways'" in text
    assert "ui.show_rejected = on" in text
    # the bad values changed nothing; the good ones took effect
    assert session.config.sampling.temperature == 0.0 and session.config.speculation.gamma == 2
    assert session.config.sampling.top_k == 40 and session.config.speculation.mode == "spec"
    # reply 1 ran to the token limit; reply 2 was cut by Ctrl-C after its first step
    assert [r.stop_reason for r in session.records] == ["max_tokens", "cancelled"]
    assert session.records[1].stats.new_tokens < 12
    assert session.records[1].stats.target_forwards == 1  # stopped before the second step
    assert "✂ [cut]" in text and "cancelled" in text
    assert text.count(" tok/s · ttft ") == 2
    assert "accepted length per step" in text  # /stats ran
    data = json.loads(saved.read_text())
    assert [t["user"] for t in data["turns"]] == ["hello there", "write a loop"]
    assert data["turns"][1]["cut"] is True
    assert data["turns"][0]["stats"]["new_tokens"] == 12
    assert f"saved 2 replies to {saved}" in text
    assert "never reached" not in [m["content"] for m in session.messages]


class EchoingRepl(Repl):
    """Shows each input line after the prompt, as the terminal does (DummyOutput draws no prompt)."""

    def handle(self, line: str) -> bool:
        self.renderer.info(f"you> {line}")
        return super().handle(line)


def screen_of(session, keys: str) -> str:
    """Everything a plain terminal shows for `keys`, each line without its trailing blanks."""
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = EchoingRepl(
            session,
            build_registry(),
            Renderer(make_console(False, out)),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
        )
        assert repl.run() == 0
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


TRANSCRIPT = """\
you> hi
⟦Hello there⟧⟨!⟩
 3 tok · 6.0 tok/s · ttft 0.25 s · accepted 2/4 drafts (50%) · 3.0 tok/step · γ 4
you> /gamma 2
speculation.gamma = 2
you> /show rejected on
ui.show_rejected = on
you> list them
⟦Sure⟧~~,~~⟨:⟩ ✂ [cut]
 2 tok · 5.0 tok/s · ttft 0.20 s · accepted 1/2 drafts (50%) · 2.0 tok/step · γ 2 · cancelled
you> /history
role       message
system     You are a helpful assistant.
user 1     hi
assistant  Hello there!
user 2     list them
assistant  Sure: ✂ [cut]
you> /quit"""


def test_a_scripted_session_shows_exactly_this_screen(tokenizer):
    first = scripted_reply(
        [("Hello", Origin.DRAFTED), (" there", Origin.DRAFTED), Rejected((7, 8), " pal"), ("!", Origin.CORRECTED)],
        ReplyStats(
            gamma=4, new_tokens=3, drafted=4, accepted=2, draft_steps=1, target_forwards=1, wall_s=0.5, ttft_s=0.25
        ),
    )
    second = scripted_reply(
        [("Sure", Origin.DRAFTED), Rejected((9,), ","), (":", Origin.CORRECTED)],
        ReplyStats(
            gamma=2, new_tokens=2, drafted=2, accepted=1, draft_steps=1, target_forwards=1, wall_s=0.4, ttft_s=0.2
        ),
        stop_reason="cancelled",
    )
    engine = ScriptedEngine([first, second])
    session = ChatSession(engine, tokenizer, CONFIG, model_context_limit=1024)
    keys = "hi\r/gamma 2\r/show rejected on\rlist them\r/history\r/quit\rnever read\r"
    assert screen_of(session, keys) == TRANSCRIPT
    # the second prompt is the whole conversation in the chat template, the first reply included
    assert tokenizer.decode(engine.prompts[1]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nHello there!<|im_end|>\n<|im_start|>user\nlist them<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_ctrl_d_quits_and_ctrl_c_on_empty_prompt_hints(session):
    status, text = run_script(session, "\x03\x04")  # Ctrl-C on an empty line, then Ctrl-D
    assert status == 0
    assert QUIT_HINT in text
    assert session.records == []


def test_ctrl_c_with_text_clears_the_line_without_sending(session):
    status, text = run_script(session, "half a thought\x03/history\r/exit\r")
    assert status == 0
    assert QUIT_HINT not in text
    assert "no messages yet" in text and session.records == []


def test_esc_enter_makes_multiline_input(session):
    status, _ = run_script(session, "/max 3\rfirst line\x1b\rsecond line\r/quit\r")
    assert status == 0
    assert session.records[0].user == "first line\nsecond line"
    assert session.records[0].stats.new_tokens == 3


def test_compare_toggle_key_and_toolbar(session):
    assert session.config.speculation.compare == "off"
    status, _ = run_script(session, "\x14/quit\r")  # Ctrl-T
    assert status == 0
    assert session.config.speculation.compare == "on"
    toggle_compare(session)
    bar = toolbar_text(session)
    for part in ("spec", "γ 4", "greedy", "compare off", "last acceptance –", "ctx 0/1024"):
        assert part in bar
    assert "top-k" not in bar and "top-p" not in bar  # greedy: they do nothing
    session.config = with_value(with_value(session.config, "sampling.temperature", 0.7), "speculation.mode", "target")
    bar = toolbar_text(session)
    assert " target · temp 0.7 · top-k off · top-p 1 · " in bar and "γ" not in bar and "drafter" not in bar


def test_toolbar_shows_last_acceptance_and_context(session):
    list(session.reply("hi"))
    bar = toolbar_text(session)
    stats = session.last_stats
    assert f"last acceptance {stats.acceptance_rate:.0%}" in bar
    assert f"ctx {stats.prompt_tokens + stats.new_tokens}/1024" in bar


def test_history_file_is_created_in_the_given_place(tmp_path):
    path = tmp_path / "state" / "specchat" / "history"
    history, problem = open_history(path)
    assert problem is None and path.exists()
    history.append_string("/gamma 3")
    assert "/gamma 3" in path.read_text()


def test_unwritable_history_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    history, problem = open_history(blocker / "history")
    assert problem and "input history is not saved" in problem


def test_f2_and_ctrl_t_toggle_compare_at_the_prompt(session):
    assert session.config.speculation.compare == "off"
    status, _ = run_script(session, "\x1bOQ/quit\r")  # F2
    assert status == 0 and session.config.speculation.compare == "on"
    run_script(session, "\x14/quit\r")  # Ctrl-T
    assert session.config.speculation.compare == "off"


def short_replies(n: int) -> list:
    return [
        scripted_reply([(f"answer {i}", Origin.TARGET)], ReplyStats(mode="target", new_tokens=1, wall_s=0.1))
        for i in range(n)
    ]


def piped_repl(session, keys: str, offer_save: bool) -> str:
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        repl = Repl(
            session,
            build_registry(),
            Renderer(make_console(False, out)),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
            offer_save=offer_save,
        )
        assert repl.run() == 0
    return out.getvalue()


def test_ctrl_d_after_a_longer_chat_offers_to_save_it(tokenizer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = ChatSession(ScriptedEngine(short_replies(4)), tokenizer, CONFIG, model_context_limit=1024)
    text = piped_repl(session, "one\rtwo\rthree\rfour\r\x04y\r", offer_save=True)
    [saved] = list(tmp_path.glob("specchat-*.md"))
    assert f"saved 4 replies to {saved.name}" in text and "## you\n\nfour" in saved.read_text()


@pytest.mark.parametrize(
    "keys, offer",
    [
        ("one\rtwo\rthree\r\x04", True),  # three replies: no question
        ("one\rtwo\rthree\rfour\r\x04", False),  # not a terminal: never asks
        ("one\rtwo\rthree\rfour\r\x04n\r", True),
    ],
)  # asked, and no
def test_ctrl_d_leaves_without_saving_when_short_piped_or_declined(tokenizer, tmp_path, monkeypatch, keys, offer):
    monkeypatch.chdir(tmp_path)
    session = ChatSession(ScriptedEngine(short_replies(4)), tokenizer, CONFIG, model_context_limit=1024)
    piped_repl(session, keys, offer_save=offer)
    assert list(tmp_path.glob("specchat-*")) == []


class SeedRecordingEngine(ScriptedEngine):
    """A ScriptedEngine that notes the seed each reply was asked to use."""

    def __init__(self, replies):
        super().__init__(replies)
        self.seeds = []

    def stream(self, prompt_ids, sampling, speculation, cancel=None, constraint=None):
        self.seeds.append(sampling.seed)
        return super().stream(prompt_ids, sampling, speculation, cancel)


def text_reply(text: str) -> list:
    return scripted_reply([(text, Origin.TARGET)], ReplyStats(mode="target", new_tokens=1, wall_s=0.1))


def test_undo_drops_the_last_exchange_and_retry_answers_again_with_a_fresh_seed(tokenizer):
    engine = SeedRecordingEngine([text_reply("Hello!"), text_reply("Bye."), text_reply("Hi again.")])
    session = ChatSession(engine, tokenizer, with_value(CONFIG, "sampling.temperature", 0.7), model_context_limit=1024)
    screen = screen_of(session, "hi\rbye\r/undo\r/retry\r/history\r/quit\r")
    assert "dropped the last exchange ('bye' and its reply); 1 left" in screen
    assert "answering the last message again (a fresh seed)" in screen
    assert screen.endswith("user 1     hi\nassistant  Hi again.\nyou> /quit")
    assert engine.prompts[2] == engine.prompts[0]  # the retry read the conversation without the old reply
    assert engine.seeds == [0, 0, RANDOM]  # the setting's seed, then a fresh one for /retry
    assert [m["content"] for m in session.messages] == ["hi", "Hi again."]


def test_load_reopens_a_saved_transcript_with_its_settings(tokenizer, tmp_path):
    saved = tmp_path / "chat.json"
    first = ChatSession(
        ScriptedEngine([text_reply("Hello!")]),
        tokenizer,
        with_value(CONFIG, "sampling.temperature", 0.7),
        model_context_limit=1024,
    )
    screen_of(first, f"/system Be brief.\rhi\r/save {saved}\r/quit\r")
    session = ChatSession(ScriptedEngine([text_reply("Again.")]), tokenizer, CONFIG, model_context_limit=1024)
    screen = screen_of(session, f"/load {saved}\r/history\rmore\r/quit\r")
    assert f"loaded 1 exchanges, the system prompt and the settings from {saved}" in " ".join(screen.split())
    assert "system     Be brief.\nuser 1     hi\nassistant  Hello!" in screen
    assert session.config.sampling.temperature == 0.7 and session.system_prompt == "Be brief."
    assert tokenizer.decode(session.engine.prompts[0]).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!"
    )
    broken = tmp_path / "broken.json"
    broken.write_text('{"turns": 3}')
    assert f"/load: cannot load '{broken}': not a specchat transcript (it needs system and turns)" in " ".join(
        screen_of(session, f"/load {broken}\r/quit\r").split()
    )
    assert len(session.records) == 2  # a bad file changed nothing


CODE_REPLY = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nand\n```sh\nls\n```\n"


def test_view_markdown_draws_the_reply_without_fences_and_view_origin_with_brackets(tokenizer):
    pieces = [
        ("Here:\n```python\ndef add(a, b):\n", Origin.DRAFTED),
        ("    return a + b\n```\nand\n```sh\nls\n```\n", Origin.CORRECTED),
    ]
    engine = ScriptedEngine(
        [scripted_reply(pieces, ReplyStats(new_tokens=2, wall_s=0.1)), text_reply("**bold** answer")]
    )
    session = ChatSession(engine, tokenizer, CONFIG, model_context_limit=1024)
    screen = screen_of(session, "hi\r/view markdown\r/view origin\r/view markdown\rmore\r/quit\r")
    as_markdown = screen.split("ui.view = markdown; the last reply:")[1].split("you> /view origin")[0]
    assert "def add(a, b):" in as_markdown and "```" not in as_markdown
    as_origin = screen.split("ui.view = origin; the last reply:")[1].split("you>")[0]
    assert as_origin.strip().startswith("⟦Here:\n```python") and "⟨    return a + b" in as_origin
    after = screen.split("you> more")[1]
    assert "── as Markdown ──\nbold answer" in after  # later replies, once done, as Markdown too
    assert session.config.ui.view == "markdown"


def test_copy_sends_the_chosen_block_by_osc52_at_a_terminal_else_writes_a_file(tokenizer, tmp_path, monkeypatch):
    import base64

    from rich.console import Console

    monkeypatch.chdir(tmp_path)
    session = ChatSession(ScriptedEngine([text_reply(CODE_REPLY)]), tokenizer, CONFIG, model_context_limit=1024)
    screen = screen_of(session, "hi\r/copy 2\r/copy\r/copy 3\r/copy 1 add.py\r/quit\r")
    assert "the output is not a terminal: wrote code block 2 of 2 (1 lines) to specchat-block-2.sh" in screen
    assert "wrote code block 1 of 2 (2 lines) to specchat-block-1.py" in screen
    assert "/copy: N must be from 1 to 2 (the last reply's code blocks)" in screen
    assert (tmp_path / "specchat-block-2.sh").read_text() == "ls\n"
    assert (tmp_path / "add.py").read_text() == "def add(a, b):\n    return a + b\n"
    out = io.StringIO()
    with create_pipe_input() as pipe:
        pipe.send_text("/copy 1\r/quit\r")
        Repl(
            session,
            build_registry(),
            Renderer(Console(file=out, force_terminal=True, color_system=None)),
            InMemoryHistory(),
            pt_input=pipe,
            pt_output=DummyOutput(),
        ).run()
    encoded = base64.b64encode(b"def add(a, b):\n    return a + b").decode()
    assert f"\x1b]52;c;{encoded}\x07" in out.getvalue() and "copied code block 1 of 2 (2 lines)" in out.getvalue()


def test_a_code_block_a_cut_reply_left_open_can_be_copied_too():
    from specchat.tui.reply_view import code_blocks

    assert [b.code for b in code_blocks("Fixed:\n```python\ndef get(self, key):\n    raise KeyError(key")] == [
        "def get(self, key):\n    raise KeyError(key"
    ]
    assert [(b.language, b.extension) for b in code_blocks(CODE_REPLY)] == [("python", "py"), ("sh", "sh")]


def test_auto_gamma_and_a_random_seed_save_as_minus_one_and_load_back(tokenizer, tmp_path):
    """The serialised form of the word settings stays -1 (as transcripts and --json wrote it before gamma and the
    seed had types: a transcript saved before reads the same), and /load reads it back as AUTO and RANDOM."""
    from specchat.config import AUTO

    saved = tmp_path / "chat.json"
    config = with_value(with_value(CONFIG, "speculation.gamma", AUTO), "sampling.seed", RANDOM)
    reply = scripted_reply([("Hello!", Origin.TARGET)], ReplyStats(mode="spec", gamma=AUTO, new_tokens=1, wall_s=0.1))
    screen_of(
        ChatSession(ScriptedEngine([reply]), tokenizer, config, model_context_limit=1024), f"hi\r/save {saved}\r/quit\r"
    )
    data = json.loads(saved.read_text())
    assert data["config"]["speculation.gamma"] == -1 and data["config"]["sampling.seed"] == -1
    assert data["turns"][0]["stats"]["gamma"] == -1 and "γ auto" in data["turns"][0]["stats_line"]
    session = ChatSession(ScriptedEngine([]), tokenizer, CONFIG, model_context_limit=1024)
    screen_of(session, f"/load {saved}\r/quit\r")
    assert session.config.speculation.gamma == AUTO and session.config.sampling.seed == RANDOM
    assert session.records[0].stats.gamma == AUTO
