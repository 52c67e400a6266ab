"""REPL fuzz: random input lines never break the chat, and a refused one changes nothing.

Every registered command (enumerated from the registry, aliases included, so a new command is fuzzed
without editing this file) gets random arguments: valid-looking values (from the command's completion
tree and the config key types), odd numbers (negative, huge, NaN, inf, non-ASCII digits), random words,
too many arguments, unicode (emoji, RTL, combining marks, zero-width, lone surrogates as a terminal's
undecodable bytes arrive), control characters and escape sequences, 10k-50k character lines, and empty
and whitespace-only lines. A few plain-text lines get replies from the tiny models.

After every line: no exception escaped; a refused line (the renderer printed an error) left the
conversation, the records and the config as they were; only /reset changes the conversation among the
commands; only /quit (or /exit) asks to leave. At the end the session still answers exactly: its greedy
reply equals the target-only greedy reply of a fresh engine to the same prompt.
"""

from __future__ import annotations

import copy
import io
import random

import pytest
import torch
from conftest import make_engine, run_reply
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from specchat.config import Config, SamplingConfig
from specchat.loading.models import LoadedPair, ModelFacts
from specchat.session.chat import ChatSession
from specchat.session.compare import Comparer
from specchat.settings import all_keys, get_value, with_value
from specchat.tui.commands import Registry, build_registry
from specchat.tui.compare_view import view_compare_fn
from specchat.tui.render import Renderer, make_console
from specchat.tui.repl import Repl

SEED = 13
LINES = 600  # lines handled directly by Repl.handle (slow: it runs in a plain `pytest`)
QUICK_LINES = 150  # the same fuzz on fewer lines, in the fast default (`pytest -m "not slow"`), with
QUICK_SEED = 0
PIPE_LINES = 60  # of those, printable ones typed again through prompt_toolkit
REPLY_TOKENS = 6  # a text line's reply is capped at this many tokens, to keep the test fast
CONTEXT = 256  # the tiny models' context limit here: short prompts stay cheap, a long paste cannot fit
EOS = {2}
NO_SUCH_USER = "nosuchuser_specchat_fuzz"

NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "3",
    "4",
    "16",
    "17",
    "-17",
    "0.5",
    "-0.5",
    "1.0",
    "5",
    "5.0001",
    "1e3",
    "1e-320",
    "1e309",
    "-1e309",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "+4",
    ".5",
    "3.",
    "1_000",
    "0x10",
    "0b11",
    "2**63",
    str(2**63),
    str(2**63 - 1),
    str(-(2**63)),
    "9" * 60,
    "9" * 5000,
    "٣",
    "１２",
    "Ⅻ",
    "1,5",
    "1 000",
    "+",
    "-",
    ".",
]
WORDS = [
    "on",
    "off",
    "auto",
    "random",
    "spec",
    "target",
    "drafter",
    "rejected",
    "true",
    "no",
    "yes",
    "AUTO",
    "Spec",
    "gamma",
    "help",
    "sampling.top_k",
    "ui.color",
    "foo",
    "x=y",
    "=",
    "==",
    "a=b=c",
    "'",
    '"',
    "`",
    "\\",
    "{}",
    "[]",
    "%s",
    "{0}",
    "$HOME",
    "*",
    "--help",
    "-",
    "?",
    ";",
    "&&",
    "|",
    "<script>",
]
UNICODE = [
    "🦜",
    "👩‍💻",
    "🏳️‍🌈",
    "مرحبا بالعالم",
    "שלום",
    "\u202ereversed\u202c",
    "\u200f",
    "e\u0301",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "日本語のテキスト",
    "\u200b",
    "\ufeff",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u2029",
    "ﷺ",
    "𝕏",
    "\U0010ffff",
    "\udcff",
    "a\udc80b",
]  # lone surrogates: undecodable input bytes
CONTROL = [
    "\x00",
    "\x01",
    "\x03",
    "\x04",
    "\x07",
    "\x08",
    "\t",
    "\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x1a",
    "\x1b",
    "\x7f",
    "\x85",
    "\x9b",
    "\x1b[31m",
    "\x1b[0m",
    "\x1b[2J",
    "\x1b[H",
    "\x1b[6n",
    "\x1b]0;title\x07",
    "\x1b[200~",
    "\x1b[201~",
    "\x1bOP",
    "\x1b[A",
    "\r\n",
]
BLANK = ["", " ", "  ", "\t", " \t \n ", "\n", "\r", "\x0b\x0c", "\u3000", "\u00a0 \u2003", "\u2028"]
PROMPTS = [
    "hello there",
    "write a loop",
    "what is 2+2?",
    "héllo wörld 🦜",
    "مرحبا",
    "def f(x):\n    return x",
    "a\x1b[31mred\x1b[0m word",
    "tab\tseparated\tcells",
    "nul\x00inside",
    "   padded   ",
]


def valid_values(command) -> list[str]:
    """Argument texts the command's own completion tree offers, one level deep and two levels deep."""
    tree = command.complete
    if isinstance(tree, (set, frozenset)):
        return sorted(tree)
    if not isinstance(tree, dict):
        return []
    values = []
    for key, sub in tree.items():
        values.append(key)
        if isinstance(sub, dict):
            values += [f"{key} {inner}" for inner in sub]
    return values


def value_for_key(key: str, rng: random.Random) -> str:
    """A value of the right type for a config key, sometimes out of range."""
    current = get_value(Config(), key)
    if isinstance(current, bool):
        return rng.choice(["on", "off", "true", "0", "maybe"])
    if isinstance(current, (int, float)):
        return rng.choice(["0", "1", "3", "8", "40", "256", "0.9", "-1", "nan", "1e9", str(CONTEXT), "10000000"])
    if isinstance(current, tuple):
        return rng.choice(["<|im_end|>", "a,b", ",", "🦜"])
    if isinstance(current, dict):
        return "{}"
    return rng.choice(["cpu", "auto", "bfloat16", "You are terse.", "x", "w8a8"])


def junk_word(rng: random.Random) -> str:
    pool = rng.choice([NUMBERS, WORDS, UNICODE, CONTROL])
    return rng.choice(pool)


def random_arguments(command, rng: random.Random) -> str:
    kind = rng.random()
    valid = valid_values(command)
    if command.name == "set":
        key = rng.choice(all_keys() + ["sampling", "nosuch.key", "a.b.c", ".", "sampling.", ".top_k"])
        value = value_for_key(key, rng) if key in all_keys() and kind < 0.6 else junk_word(rng)
        return rng.choice([f"{key} {value}", f"{key}={value}", f"{key} = {value}", key, f"{key} {value} extra"])
    if command.name in ("save", "save!"):
        return save_argument(rng)
    if kind < 0.3 and valid:
        return rng.choice(valid)
    if kind < 0.45:
        return rng.choice(NUMBERS)
    if kind < 0.55:
        return ""
    if kind < 0.8:
        return junk_word(rng)
    return " ".join(junk_word(rng) for _ in range(rng.randint(2, 8)))  # too many arguments


def save_argument(rng: random.Random) -> str:
    """A file name that can only land inside the test's working directory (tmp_path), or fail."""
    junk = "".join(junk_word(rng) for _ in range(rng.randint(0, 3)))
    junk = junk.replace("/", "_").replace("..", "_").replace("~", "_")
    stem = "f" + junk
    return rng.choice(
        [
            f"{stem}.md",
            f"{stem}.json",
            f"{stem}.MD",
            f"{stem}.txt",
            stem,
            f"nodir/{stem}.md",
            f"{'x' * 300}.md",
            f"~{NO_SUCH_USER}/{stem}.md",
            f"{stem}\x00.md",
            "",
            f"a b {stem}.json",
        ]
    )


def long_text(rng: random.Random) -> str:
    n = rng.randint(10_000, 50_000)
    piece = rng.choice(["x", "lorem ipsum ", "🦜", "e\u0301", "\x1b[31m", "a\tb ", "مرحبا "])
    return "w" + (piece * (n // len(piece) + 1))[:n]


def command_line(registry: Registry, rng: random.Random) -> str:
    command = rng.choice(registry.commands)
    name = rng.choice((command.name, *command.aliases))
    if rng.random() < 0.2:  # mostly the command itself; sometimes its name in capitals, or a typo
        name = rng.choice([name.upper(), name.capitalize(), name[:-1] or name, name + "x"])
    slash = "/" if rng.random() < 0.8 else rng.choice(["//", " /", "\t/"])
    sep = " " if rng.random() < 0.8 else rng.choice(["  ", "\t", "", " \x00 "])
    return f"{slash}{name}{sep}{random_arguments(command, rng)}" + rng.choice(["", "", " ", "\t", "\n"])


def random_line(registry: Registry, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.70:
        return command_line(registry, rng)
    if roll < 0.76:
        return rng.choice(BLANK)
    if roll < 0.80:
        return rng.choice(["/", "//", "/ gamma 3", "/🦜", "/\x00", "/\x1b[A", "/" + junk_word(rng), "/" * 40])
    if roll < 0.86:  # a long line: a command argument, or a paste that cannot fit the context
        text = long_text(rng)
        return rng.choice([text, text, f"/system {text}", f"/gamma {text}", f"/help {text}", f"/{text}"])
    if roll < 0.93:
        return rng.choice(PROMPTS)
    return " ".join(junk_word(rng) for _ in range(rng.randint(1, 5)))  # junk text as a prompt


def terminal_stream() -> io.TextIOWrapper:
    """Like a UTF-8 terminal's sys.stdout: strict, so a character it cannot encode raises."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)


class RecordingRenderer(Renderer):
    """A Renderer that remembers the errors it drew (a refused command or reply)."""

    def __init__(self, console):
        super().__init__(console)
        self.errors: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)
        super().error(message)


CONVERSATION_VERBS = ("reset", "undo", "retry", "load", "edit")  # the commands that may change the conversation


class CheckedRepl(Repl):
    """A Repl that checks the invariants around every line it handles."""

    def __init__(self, session, registry, renderer, **kwargs):
        super().__init__(session, registry, renderer, InMemoryHistory(), **kwargs)
        self.handled = self.refused = self.replies = 0
        self.lines: list[str] = []

    def handle(self, line: str) -> bool:
        session, text = self.session, line.strip()
        is_command = text.startswith("/")
        if text:  # keep replies (and /retry's) short whatever /max the fuzz set, off (0) included
            max_tokens = min(session.config.sampling.max_new_tokens or REPLY_TOKENS, REPLY_TOKENS)
            session.config = with_value(session.config, "sampling.max_new_tokens", max_tokens)
        messages, config, records = copy.deepcopy(session.messages), session.config, len(session.records)
        errors = len(self.renderer.errors)
        keep = super().handle(line)
        self.handled += 1
        self.lines.append(line)
        new_errors = self.renderer.errors[errors:]
        assert len(new_errors) <= 1, f"{line[:80]!r} drew {len(new_errors)} errors: {new_errors}"
        command = self.registry.find(text.partition(" ")[0]) if is_command else None
        assert keep != (command is not None and command.name == "quit"), line[:80]
        if new_errors:
            self.refused += 1
            assert session.messages == messages, f"refused {line[:80]!r} changed the conversation"
            assert session.config == config, f"refused {line[:80]!r} changed the config"
            assert len(session.records) == records, f"refused {line[:80]!r} added a record"
        if is_command and (command is None or command.name not in CONVERSATION_VERBS):
            assert session.messages == messages, f"{line[:80]!r} changed the conversation"
        if text and not is_command and len(text) >= 10_000:
            assert new_errors and "prompt tokens" in new_errors[0], f"a {len(text)}-character paste was not refused"
        if text and not is_command and not new_errors:
            self.replies += 1
            assert len(session.records) == records + 1 and session.messages[-2:] == [
                {"role": "user", "content": text},
                {"role": "assistant", "content": session.records[-1].text},
            ]
        return keep


@pytest.fixture
def one_thread():
    """Forwards of the tiny models on one thread: on a shared CPU, more threads only wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def session(target, similar_drafter_model, tokenizer, tmp_path, monkeypatch, one_thread):
    """A chat on the tiny models with compare reruns, working in tmp_path (HOME too: /save writes only there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    facts = ModelFacts("tiny", "test", 1, "float32", "none", "cpu", 0, 0.0)
    pair = LoadedPair(
        target,
        similar_drafter_model,
        tokenizer,
        EOS,
        len(tokenizer),
        context_limit=CONTEXT,
        target_facts=facts,
        drafter_facts=facts,
    )
    config = with_value(Config(), "sampling.max_new_tokens", REPLY_TOKENS)
    return ChatSession(
        make_engine(target, similar_drafter_model, tokenizer, eos_ids=EOS),
        tokenizer,
        config,
        CONTEXT,
        compare_fn=view_compare_fn(Comparer(pair)),
    )


def assert_answers_exactly(repl: CheckedRepl, target, tokenizer) -> None:
    """Sane settings by commands, then a greedy reply equal to a fresh target-only engine's."""
    for line in (
        "/greedy",
        "/repeat_penalty 1",  # the penalties shape greedy replies too: off, as the fresh engine's
        "/presence_penalty 0",
        "/mode spec",
        "/gamma 4",
        f"/max {REPLY_TOKENS}",
        "/set ui.context_limit 0",
        "/system You are terse.",
    ):
        errors = len(repl.renderer.errors)
        assert repl.handle(line) and len(repl.renderer.errors) == errors, repl.renderer.errors[errors:]
    records = len(repl.session.records)
    assert repl.handle("write a function that reverses a list")
    assert len(repl.session.records) == records + 1, repl.renderer.errors[-1:]
    reply = repl.session.records[-1]
    fresh = make_engine(target, None, tokenizer, eos_ids=EOS)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=REPLY_TOKENS)
    _, done = run_reply(fresh, repl.session.last_prompt_ids, sampling, mode="target")
    assert tuple(token.id for token in reply.tokens) == done.ids
    assert reply.text == done.text


def fuzz_lines(registry: Registry, rng: random.Random, count: int = LINES) -> list[str]:
    lines = [random_line(registry, rng) for _ in range(count)]
    # every command, alias and blank form at least once, whatever the seed drew
    lines += [f"/{name}" for name in registry.names()] + BLANK
    rng.shuffle(lines)
    return lines + ["/save fuzz-at-the-end.md"]  # whatever the seed drew, the chat the fuzz leaves can be saved


def random_lines_never_break_the_chat(session, target, tokenizer, tmp_path, count, seed):
    registry = build_registry()
    renderer = RecordingRenderer(make_console(True, terminal_stream()))  # colour path: 'thinking…', styles
    repl = CheckedRepl(session, registry, renderer)
    lines = fuzz_lines(registry, random.Random(seed), count)
    quits = 0
    for line in lines:
        quits += not repl.handle(line)  # /quit: the loop would end here; the fuzz goes on with the same session
    assert repl.handled == len(lines) and quits > 0 and repl.refused > len(lines) // 4 and repl.replies > 3
    assert_answers_exactly(repl, target, tokenizer)
    assert (tmp_path / "fuzz-at-the-end.md").is_file()  # the last line's /save went through, here


@pytest.mark.slow
def test_random_lines_never_break_the_chat(session, target, tokenizer, tmp_path):
    random_lines_never_break_the_chat(session, target, tokenizer, tmp_path, LINES, SEED)


def test_fewer_random_lines_never_break_the_chat(session, target, tokenizer, tmp_path):
    random_lines_never_break_the_chat(session, target, tokenizer, tmp_path, QUICK_LINES, QUICK_SEED)


def typeable(line: str) -> bool:
    """Lines prompt_toolkit takes as plain text: no control keys, no quit, not too long to type quickly."""
    if any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in line) or len(line) > 2000:
        return False
    registry = build_registry()
    command = registry.find(line.strip().partition(" ")[0]) if line.strip().startswith("/") else None
    return command is None or command.name != "quit"


def test_random_lines_typed_through_prompt_toolkit(session, target, tokenizer):
    registry = build_registry()
    lines = [line for line in fuzz_lines(registry, random.Random(SEED + 1)) if typeable(line)][:PIPE_LINES]
    out = terminal_stream()
    renderer = RecordingRenderer(make_console(False, out))
    with create_pipe_input() as pipe:
        pipe.send_text("".join(line + "\r" for line in lines) + "/quit\r" + "never read\r")
        repl = CheckedRepl(session, registry, renderer, pt_input=pipe, pt_output=DummyOutput())
        assert repl.run() == 0
    assert repl.lines == lines + ["/quit"]  # prompt_toolkit handed on each line as typed
    assert "Traceback" not in out.buffer.getvalue().decode()
    assert "never read" not in [m["content"] for m in session.messages]
    assert_answers_exactly(repl, target, tokenizer)


def test_a_long_paste_is_refused_in_one_line_and_changes_nothing(session):
    renderer = RecordingRenderer(make_console(False, io.StringIO()))
    repl = CheckedRepl(session, build_registry(), renderer)
    assert repl.handle("hello there") and len(session.messages) == 2
    before = copy.deepcopy(session.messages)
    assert repl.handle("lorem ipsum " * 4000)  # 48k characters
    [error] = renderer.errors
    assert error.startswith("the message needs ") and "prompt tokens but only" in error
    assert session.messages == before and len(session.records) == 1


# ----- regressions the fuzz found ------------------------------------------------------------------
UNDECODABLE = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # Latin-1 bytes typed into a UTF-8 REPL


def test_a_message_with_undecodable_bytes_is_refused_and_sends_nothing(session):
    """The tokenizer raised TypeError on a lone surrogate, and the traceback ended the chat."""
    renderer = RecordingRenderer(make_console(False, terminal_stream()))
    repl = CheckedRepl(session, build_registry(), renderer)
    assert repl.handle(UNDECODABLE)
    assert renderer.errors == [
        "the message has a byte that is not UTF-8 at character 4 (the terminal could not decode it); nothing was sent"
    ]
    assert session.messages == [] and session.records == []


def test_a_system_prompt_with_undecodable_bytes_is_refused(session):
    """It was taken, and then every later reply raised TypeError in the tokenizer."""
    renderer = RecordingRenderer(make_console(False, terminal_stream()))
    repl = CheckedRepl(session, build_registry(), renderer)
    for line in (f"/system {UNDECODABLE}", f"/set ui.system_prompt {UNDECODABLE}"):
        assert repl.handle(line)
        assert "must be UTF-8 text (this holds a byte the terminal could not decode)" in renderer.errors[-1]
    assert len(renderer.errors) == 2 and session.system_prompt == Config().ui.system_prompt
    assert repl.handle("hello there") and len(session.records) == 1


def test_an_echoed_undecodable_byte_prints_as_a_replacement_character():
    """'got ...' echoed the byte, and a UTF-8 terminal's strict stream raised UnicodeEncodeError."""
    out = terminal_stream()
    Renderer(make_console(False, out)).error(f"speculation.gamma must be an integer, got '{UNDECODABLE}'")
    assert "got 'caf\ufffd au lait'" in out.buffer.getvalue().decode()


@pytest.mark.parametrize(
    "name, why",
    [("chat\x00.md", "embedded null byte"), (f"~{NO_SUCH_USER}/chat.md", "Could not determine home directory")],
)
def test_save_to_an_impossible_name_is_refused_in_one_line(session, name, why):
    """ValueError (a NUL in the name) and RuntimeError (~user for no such user) escaped /save."""
    renderer = RecordingRenderer(make_console(False, terminal_stream()))
    assert CheckedRepl(session, build_registry(), renderer).handle(f"/save {name}")
    [error] = renderer.errors
    assert error.startswith("/save: cannot save to ") and why in error


@pytest.mark.parametrize("mode", ["spec", "target"])
@pytest.mark.parametrize("setting", ["/top_p 1e-320", "/temp 1e-320", "/temp 1e-38"])
def test_sampling_settings_below_float32s_range_still_reply(session, mode, setting):
    """In range, yet 0 or overflowing in float32: the nucleus kept no token, or logits / T became inf - inf = nan,
    and the reply raised."""
    renderer = RecordingRenderer(make_console(False, terminal_stream()))
    repl = CheckedRepl(session, build_registry(), renderer)
    for line in ("/temp 0.7", setting, f"/mode {mode}", "hello there"):
        assert repl.handle(line)
    assert renderer.errors == [] and len(session.records) == 1
