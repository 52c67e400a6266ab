"""The command line: one-shot text and --json output, stdin prompts, one-line errors, and a real pty session."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from tinypair import loader, tiny_pair

from specchat.errors import ModelLoadError
from specchat.tui.cli import main

ROOT = Path(__file__).resolve().parents[2]
ESCAPE = re.compile(r"\x1b\[")
ESCAPE_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def pair(tokenizer, target, unrelated_drafter_model):
    return tiny_pair(tokenizer, target, unrelated_drafter_model)


def run_cli(argv, pair, stdin_text="", stdin=None, load=None):
    out, err = io.StringIO(), io.StringIO()
    status = main(
        argv, load=load or loader(pair), compare=None, stdin=stdin or io.StringIO(stdin_text), stdout=out, stderr=err
    )
    return status, out.getvalue(), err.getvalue()


def test_one_shot_in_a_pipe_writes_the_reply_alone_and_its_stats_line_to_stderr(pair):
    """stdout is not a terminal: the reply's text alone (no origin marks), one line; the cut mark and the stats
    line go to stderr, after the loading lines."""
    status, out, err = run_cli(["--prompt", "hello there", "sampling.max_new_tokens=6", "speculation.gamma=4"], pair)
    assert status == 0, err
    assert out.count("\n") == 1 and not re.search("[⟦⟧⟨⟩⦃⦄✂]", out)
    assert re.fullmatch(
        r"✂ \[cut: /max reached\] · 6 tok · [\d.]+ tok/s · ttft [\d.]+ s · prompt \d+ tok in [\d.]+ s "
        r"\([\d,]+ tok/s, [\d,]+ more cached\) · accepted \d+/\d+ drafts \(\d+%\) · "
        r"[\d.]+ tok/step · γ 4 · hit max tokens \(/max\)",
        err.splitlines()[-1],
    ), err
    assert not ESCAPE.search(out)  # stdout is not a terminal: plain text
    assert pair.progress_calls[-1].sampling.max_new_tokens == 6


def test_json_output_is_one_object_with_the_exact_prompt_ids(pair, tokenizer):
    status, out, err = run_cli(["--prompt", "hi", "--json", "sampling.max_new_tokens=5", "speculation.gamma=2"], pair)
    assert status == 0, err
    data = json.loads(out)
    assert set(data) >= {"prompt_ids", "text", "tokens", "stats"}
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert data["prompt_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert len(data["tokens"]) == 5 == data["stats"]["new_tokens"]
    assert "".join(t["text"] for t in data["tokens"]) == data["text"]
    assert {t["origin"] for t in data["tokens"]} <= {"drafted", "corrected", "bonus", "target"}
    assert data["stats"]["gamma"] == 2 and data["stats"]["prompt_tokens"] == len(data["prompt_ids"])
    reused = data["stats"]["reused_tokens"]  # the warm-up's system prompt, its cache kept; its reply forgotten
    assert tokenizer.decode(data["prompt_ids"][:reused]).startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert "hi" in tokenizer.decode(data["prompt_ids"][reused:])  # the message itself is read


def test_prompt_from_stdin_when_it_is_not_a_terminal(pair):
    status, out, _ = run_cli(
        ["--json", "sampling.max_new_tokens=3", "speculation.mode=target"], pair, stdin_text="  from a pipe \n"
    )
    assert status == 0
    data = json.loads(out)
    assert data["stats"]["mode"] == "target"
    assert {t["origin"] for t in data["tokens"]} == {"target"}


def test_target_only_pair_works_in_target_mode(tokenizer, target):
    alone = tiny_pair(tokenizer, target, with_drafter=False)
    status, out, err = run_cli(["--prompt", "x", "speculation.mode=target", "sampling.max_new_tokens=3"], alone)
    assert status == 0, err
    assert "target only" in err.splitlines()[-1]


@pytest.mark.parametrize(
    "argv, message, code",
    [
        (["--prompt", "x", "sampling.tempx=1"], "specchat: error: unknown key 'sampling.tempx'", 2),
        (
            ["--prompt", "x", "speculation.gamma=99"],
            "specchat: error: speculation.gamma must be an integer from 0 to 16",
            2,
        ),
        (["--prompt", "x", "gamma"], "specchat: error: override 'gamma' must look like section.key=value", 2),
        (["--bogus"], "specchat: error: unrecognized arguments: --bogus (try --help)", 2),
        (["--config", "nowhere.toml"], "specchat: error: config file nowhere.toml not found", 2),
        (["--prompt", "   "], "specchat: error: the prompt is empty", 2),
    ],
)
def test_errors_are_one_line_and_non_zero(pair, argv, message, code):
    status, out, err = run_cli(argv, pair)
    assert status == code
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_overrides_may_stand_before_and_after_options(pair):
    status, out, err = run_cli(
        ["speculation.mode=target", "--prompt", "x", "sampling.max_new_tokens=3", "--json"], pair
    )
    assert status == 0, err
    result = json.loads(out)
    assert result["stats"]["mode"] == "target" and len(result["tokens"]) <= 3


def test_json_without_a_prompt_is_refused(pair):
    status, out, err = run_cli(["--json"], pair, stdin=Tty())
    assert status == 2 and out == ""
    assert err == "specchat: error: --json answers one prompt: give --prompt TEXT or pipe the text to stdin\n"
    assert pair.progress_calls == []  # refused before loading anything


def test_model_load_error_is_one_line(pair):
    def failing(cfg, progress=None):
        raise ModelLoadError("target bundled:nothing is not a bundled model; bundled: a, b")

    status, out, err = run_cli(["--prompt", "x"], pair, load=failing)
    assert status == 1
    assert err == "specchat: error: target bundled:nothing is not a bundled model; bundled: a, b\n"


def test_too_long_prompt_is_refused_in_one_line(tokenizer, target, unrelated_drafter_model):
    """The system prompt and a short message fit (80 tokens: the warm-up runs); 50 words do not."""
    small = tiny_pair(tokenizer, target, unrelated_drafter_model, context_limit=80)
    status, _, err = run_cli(["--prompt", "word " * 50, "sampling.max_new_tokens=4"], small)
    assert status == 1
    progress_lines, error = err.rstrip("\n").rsplit("\n", 1)
    assert progress_lines == "building tiny models\nready\nwarming up the models"
    assert error.startswith("specchat: error: the message needs ")


def test_no_color_env_and_flag_keep_a_terminal_plain(pair, monkeypatch):
    out, err = Tty(), io.StringIO()
    assert (
        main(
            ["--prompt", "hi", "sampling.max_new_tokens=3"],
            load=loader(pair),
            compare=None,
            stdin=io.StringIO(),
            stdout=out,
            stderr=err,
        )
        == 0
    )
    assert ESCAPE.search(out.getvalue())  # a terminal gets colour
    for argv, env in ((["--no-color"], {}), ([], {"NO_COLOR": "1"})):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        out = Tty()
        assert (
            main(
                argv + ["--prompt", "hi", "sampling.max_new_tokens=3"],
                load=loader(pair),
                compare=None,
                stdin=io.StringIO(),
                stdout=out,
                stderr=io.StringIO(),
            )
            == 0
        )
        assert not ESCAPE.search(out.getvalue()) and " tok/s " in out.getvalue()


# The tiny pair, with the first reply's third target forward held until Ctrl-C arrives (it creates the
# file $HELD_FLAG then): no race.
DRIVER = (
    "import os, sys; sys.path.insert(0, 'tests'); "
    "from tinypair import tiny_pair, loader, hold_the_first_reply_until_ctrl_c; "
    "from specchat.tui.cli import main; pair = tiny_pair(); "
    "hold_the_first_reply_until_ctrl_c(pair.target, os.environ.get('HELD_FLAG', '')); "
    "raise SystemExit(main(sys.argv[1:], load=loader(pair)))"
)


def test_interactive_session_in_a_real_terminal(tmp_path):
    """pexpect drives the real CLI in a pty: banner, a reply, a command, Ctrl-C mid-reply, /quit."""
    pexpect = pytest.importorskip("pexpect")
    held = tmp_path / "held"
    env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        COLUMNS="120",
        LINES="40",
        NO_COLOR="1",
        TERM="xterm",
        PROMPT_TOOLKIT_NO_CPR="1",
        HELD_FLAG=str(held),
    )
    child = pexpect.spawn(
        sys.executable,
        ["-c", DRIVER, "sampling.max_new_tokens=400", "ui.context_limit=1024"],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 120),
    )
    try:
        child.expect("specchat · target tiny-target")
        child.expect("legend: ⟦drafted\\+accepted⟧")  # NO_COLOR: the origins in brackets
        child.expect("you>")
        child.send("/gamma 2\r")
        child.expect("speculation.gamma = 2")
        child.send("/nope\r")
        child.expect("unknown command /nope")
        child.send("tell me a story\r")
        child.expect_exact("\x1b[?2004l")  # the prompt has handed the terminal over to the reply
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:  # two steps done, the third held
            time.sleep(0.02)
        assert held.exists()
        child.sendintr()  # Ctrl-C mid-reply (the held forward goes on once it has arrived)
        child.expect("cut")
        child.expect(r"tok/s · ttft [\d.]+ s · prompt \d+ tok in [\d.]+ s [^·]*· accepted \d+/\d+ drafts")
        child.expect("cancelled")
        child.expect("you>")
        child.send("/max 3\r")
        child.expect("sampling.max_new_tokens = 3")
        child.send("again\r")
        child.expect(r" 3 tok · ")
        child.send("/quit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "tell me a story" in (tmp_path / "state" / "specchat" / "history").read_text()


def test_json_output_says_why_the_reply_stopped(pair):
    status, out, err = run_cli(["--prompt", "hi", "--json", "sampling.max_new_tokens=3"], pair)
    assert status == 0, err
    assert json.loads(out)["stop_reason"] == "max_tokens"
    eos = next(iter(pair.eos_ids))
    status, out, err = run_cli(
        ["--prompt", "hi", "--json", "sampling.max_new_tokens=3"], tiny_pair_stopping_at_once(pair, eos)
    )
    assert status == 0, err
    data = json.loads(out)
    assert data["stop_reason"] == "eos" and [t["id"] for t in data["tokens"]][-1:] == [eos]


def tiny_pair_stopping_at_once(pair, eos):
    """The pair with a target whose head always favours `eos`: every reply is that one token."""
    import copy

    import torch

    target = copy.deepcopy(pair.target)
    with torch.no_grad():
        target.lm_head.weight[eos] = target.lm_head.weight[eos] * 0 + 10 * target.lm_head.weight.abs().max()
        target.model.norm.weight.abs_()
    return tiny_pair(pair.tokenizer, target, pair.drafter)


def test_ctrl_c_while_the_models_load_exits_130_in_one_line(pair):
    def load(cfg, progress=None):
        progress("reading weights", 0.3)
        raise KeyboardInterrupt

    status, out, err = run_cli(["--prompt", "hello"], pair, load=load)
    assert status == 130 and out == "" and "Traceback" not in err
    assert err.splitlines() == ["reading weights", "specchat: interrupted"]  # the progress so far, then one line


def test_help_lists_the_usage_and_exits_0(pair, capsys):
    status, out, err = run_cli(["--help"], pair)
    shown = out + capsys.readouterr().out  # argparse writes to sys.stdout
    assert status == 0 and err == "" and not pair.progress_calls  # nothing loaded
    assert shown.startswith("usage: specchat ") and "--prompt" in shown and "section.key=value" in shown


def run_specchat_script(option: str):
    """The installed `specchat` script (pyproject's [project.scripts]) run with one option; each run starts
    a Python that imports torch and transformers (seconds)."""
    import subprocess

    script = Path(sys.executable).with_name("specchat")
    if not script.exists():
        pytest.skip(f"no specchat script next to {sys.executable}: the package is not installed in this venv")
    return subprocess.run([str(script), option], capture_output=True, text=True, timeout=120)


def test_the_specchat_console_script_runs_the_cli():
    """The script reaches cli.main and passes its status on: a bad option's one-line error with status 2,
    without loading any model."""
    bad = run_specchat_script("--bogus")
    assert bad.returncode == 2 and bad.stderr == "specchat: error: unrecognized arguments: --bogus (try --help)\n"


def test_the_specchat_console_script_shows_the_help():
    shown = run_specchat_script("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: specchat ")


@pytest.mark.parametrize("argv, usage", [(["--help"], "usage: specchat "), (["serve", "-h"], "usage: specchat serve ")])
def test_the_help_answers_before_torch_is_imported(argv, usage):
    """entry.py's quick help: the parser alone (0.07 s against 9.5 on a Zen 3, where the models' code came first)."""
    import subprocess

    code = (
        f"import sys; from specchat.entry import main; status = main({argv!r}); print('torch' in sys.modules, status)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith(usage) and done.stdout.splitlines()[-1] == "False 0", done.stderr


def test_the_program_exits_with_main_s_status_and_leaves_its_objects_to_no_collection(monkeypatch):
    """entry.run: main's status is the exit status, and what the run made is frozen out of the teardown's
    collections (gc.freeze), which took seconds over a loaded pair."""
    import gc

    from specchat import entry

    monkeypatch.setattr(entry, "main", lambda: 3)
    try:
        with pytest.raises(SystemExit) as done:
            entry.run()
        assert done.value.code == 3 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_help_option_given_as_a_value_is_no_help():
    """`--system --help`: argparse reads no value there; the chat's own run says so, as without quick help."""
    from specchat.entry import quick_help

    assert quick_help(["--system", "--help"]) is None
    assert quick_help(["--", "--help"]) is None and quick_help(["train-drafter", "--help"]) is None


def test_show_rejected_from_a_config_file_marks_the_refused_drafts(pair, tmp_path):
    """ui.show_rejected = true in a --config file: the one-shot reply shows the refused drafts (~~x~~ in plain
    text); the same reply without it shows none."""
    config = tmp_path / "mine.toml"
    config.write_text("[ui]\nshow_rejected = true\n[speculation]\ngamma = 4\n[sampling]\nmax_new_tokens = 12\n")
    status, shown, err = run_cli(["--config", str(config), "--prompt", "hello there"], pair)
    assert status == 0, err
    assert pair.progress_calls[-1].ui.show_rejected
    config.write_text("[speculation]\ngamma = 4\n[sampling]\nmax_new_tokens = 12\n")
    status, hidden, err = run_cli(["--config", str(config), "--prompt", "hello there"], pair)
    assert status == 0, err
    assert shown.count("~~") >= 2 and "~~" not in hidden


def origins_from_marks(text: str) -> list[tuple[str, str]]:
    """Each character of a reply printed without colour, with the origin its brackets give (docs/commands.md)."""
    opening = {"⟦": "drafted", "⟨": "corrected", "⦃": "bonus"}
    closing = {"⟧": "drafted", "⟩": "corrected", "⦄": "bonus"}
    current, out = None, []
    for char in text:
        if char in opening:
            assert current is None, text
            current = opening[char]
        elif char in closing:
            assert current == closing[char], text
            current = None
        else:
            out.append((char, current or "target"))
    assert current is None, text
    return out


def test_every_tokens_origin_can_be_read_back_from_the_text_without_colour(tokenizer, target, similar_drafter_model):
    """The same greedy reply as --json (its tokens' origins) and as --no-color text through a pipe: the brackets
    give every character's origin, and stripping them gives the reply's text."""
    pair = tiny_pair(tokenizer, target, similar_drafter_model)
    args = ["--prompt", "hello there", "sampling.max_new_tokens=24", "speculation.gamma=3"]
    status, out, err = run_cli([*args, "--json"], pair)
    assert status == 0, err
    tokens = json.loads(out)["tokens"]
    status, out, err = run_cli([*args, "--no-color", "--marks"], pair)  # a pipe: marks only when asked
    assert status == 0, err
    reply = out.removesuffix("\n")  # the stats line went to stderr
    assert len({t["origin"] for t in tokens}) >= 3, tokens  # drafted and two of corrected, bonus, target
    expected = [(char, t["origin"]) for t in tokens for char in t["text"]]
    assert origins_from_marks(reply) == expected
    assert re.sub("[⟦⟧⟨⟩⦃⦄]", "", reply) == "".join(t["text"] for t in tokens)


def test_the_loading_bar_names_each_step_and_keeps_the_slow_ones():
    """A bar per step, named by the step's message; a step of 2 s or more stays on screen with its time."""
    from rich.console import Console

    from specchat import launch as cli

    # each step's start and end: starting 0.1 s, assembling 3.0, compiling 56.5, quantizing 1.0, warming up 0.5
    clock = iter([0.0, 0.1, 0.1, 3.1, 3.1, 59.6, 59.6, 60.6, 60.6, 61.1])
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=120)
    seen = []

    def work(report):
        for message, fraction in (
            ("assembling qwen.gguf", 0.5),
            ("compiling the w4a8 kernel", None),
            ("quantizing target layer 1 of 28", 1 / 28),
            ("warming up the models", None),
        ):
            report(message, fraction)
            seen.append([task.description for task in progress_of(report).tasks])
        return "pair"

    def progress_of(report):
        return report.__self__.progress

    assert cli.with_progress(console, work, clock=lambda: next(clock)) == "pair"
    assert seen == [
        ["assembling qwen.gguf"],
        ["compiling the w4a8 kernel"],
        ["quantizing target layer 1 of 28"],
        ["warming up the models"],
    ]  # one step at a time, each its own task (own bar and time)
    lines = [ESCAPE_SEQUENCE.sub("", line).strip() for line in out.getvalue().splitlines() if "✓" in line]
    assert lines == ["✓ assembling qwen.gguf · 3.0 s", "✓ compiling the w4a8 kernel · 56.5 s"]


def test_a_notice_stays_on_screen_however_quick_and_the_step_goes_on():
    """A Notice (a fallback, a slower path, requantized weights) is a line that stays; the current step's bar
    carries on: a notice is not a step."""
    from rich.console import Console

    from specchat import launch as cli
    from specchat.progress import notify

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=160)
    seen = []

    def work(report):
        report("loading target x", None)
        notify(report, "target x: 29 Q6_K tensors requantized to 6-bit w4a8 levels")
        seen.append([task.description for task in report.__self__.progress.tasks])
        return "pair"

    assert cli.with_progress(console, work, clock=lambda: 0.0) == "pair"
    assert seen == [["loading target x"]]
    lines = [ESCAPE_SEQUENCE.sub("", line).strip() for line in out.getvalue().splitlines()]
    assert "! target x: 29 Q6_K tensors requantized to 6-bit w4a8 levels" in lines


def test_target_and_drafter_flags_set_the_two_sources(pair):
    status, _, err = run_cli(["--prompt", "hi", "--max", "2", "--target", "t.gguf", "--drafter", "bundled:x"], pair)
    assert status == 0, err
    cfg = pair.progress_calls[-1]
    assert (cfg.target.source, cfg.drafter.source) == ("t.gguf", "bundled:x")
    status, _, err = run_cli(["--prompt", "hi", "--max", "2", "--target", "t.gguf", "target.source=u.gguf"], pair)
    assert status == 0 and pair.progress_calls[-1].target.source == "t.gguf"  # the flag wins over an override


def test_system_and_max_flags(pair, tokenizer):
    status, out, err = run_cli(["--prompt", "hi", "--json", "--system", "Be terse.", "--max", "3"], pair)
    assert status == 0, err
    data = json.loads(out)
    assert tokenizer.decode(data["prompt_ids"]).startswith("<|im_start|>system\nBe terse.<|im_end|>")
    assert data["stats"]["new_tokens"] == 3 and data["stop_reason"] == "max_tokens"
    status, _, err = run_cli(["--prompt", "hi", "--max", "lots"], pair)
    assert status == 2 and err == "specchat: error: sampling.max_new_tokens must be an integer or off, got 'lots'\n"


def test_a_failing_chat_template_ends_the_start_in_one_line(tokenizer, target, unrelated_drafter_model):
    import copy

    hostile = copy.deepcopy(tokenizer)
    hostile.chat_template = "{{ raise_exception('this template refuses everything') }}"
    status, out, err = run_cli(["--prompt", "hello"], tiny_pair(hostile, target, unrelated_drafter_model))
    assert status == 1 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "specchat: error: the model's chat template failed: TemplateError: this template refuses everything"
    )


HOSTILE_TEMPLATES = {  # each: what its one line may say (which limit a machine meets first can differ)
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}": "took more than|did not finish",
    "{{ 'a' * 300000000 }}": "took more than|wrote more than|did not finish",  # 300 MB: any limit, on busy cores
    "{% set s = namespace(t='a') %}{% for i in range(40) %}{% set s.t = s.t ~ s.t %}{% endfor %}{{ s.t }}": "took more|did not finish",
    "{% for i in range(99999) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}": "wrote more than",
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}": "did not finish",
}


@pytest.mark.parametrize("template", list(HOSTILE_TEMPLATES))
def test_a_template_that_loops_or_grows_ends_the_start_in_one_line(tokenizer, target, template):
    """Each of these took the machine before (20 GB and the OOM killer, or no end): now the warm-up's probe
    (session/template_probe.py) stops it within its limits, one line, nothing left running."""
    import copy

    from specchat.session.template_probe import PROBE_SECONDS

    hostile = copy.deepcopy(tokenizer)
    hostile.chat_template = template
    began = time.perf_counter()
    status, out, err = run_cli(["--prompt", "hello"], tiny_pair(hostile, target, None, with_drafter=False))
    assert status == 1 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1].startswith("specchat: error: the model's chat template ")
    assert re.search(HOSTILE_TEMPLATES[template], err.splitlines()[-1])
    assert time.perf_counter() - began < 2 * PROBE_SECONDS  # the probe's limit and the start around it, on busy cores


def test_a_system_prompt_past_the_context_is_refused_before_any_forward(pair):
    began = time.perf_counter()
    status, out, err = run_cli(["--prompt", "hi", "--system", "word " * 4000, "ui.context_limit=1024"], pair)
    assert status == 1 and out == "" and "Traceback" not in err
    last = err.splitlines()[-1]
    assert (
        last.startswith("specchat: error: the system prompt with a short message is ") and "fit (context 1,024" in last
    )
    assert time.perf_counter() - began < 10


def test_a_huge_setting_is_refused_in_one_short_line(pair):
    status, out, err = run_cli(["--prompt", "hi", "--system", "x" * 1_000_001], pair)
    assert status == 2 and err.count("\n") == 1 and len(err) < 300
    assert "ui.system_prompt must be at most 1,000,000 characters (this holds 1,000,001)" in err


@pytest.mark.parametrize("temperature", ["0", "0.7"])
def test_a_target_whose_logits_are_nan_ends_the_start_in_one_line(tokenizer, temperature):
    import torch
    from tiny_models import build_model

    target = build_model(len(tokenizer), seed=1, layers=2)
    with torch.no_grad():
        target.lm_head.weight.fill_(float("nan"))
    status, out, err = run_cli(
        ["--prompt", "hi", f"sampling.temperature={temperature}"], tiny_pair(tokenizer, target, with_drafter=False)
    )
    assert status == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("specchat: error: the target's probabilities for the next token are not")


def test_prompt_dash_reads_the_prompt_from_stdin(pair):
    """`--prompt -` is stdin's text, as in most tools, never a literal '-' sent to the model."""
    args = ["--json", "sampling.max_new_tokens=4"]
    status, out, err = run_cli(["--prompt", "-", *args], pair, stdin=Tty("what is a list?\n"))
    assert status == 0, err
    status, expected, err = run_cli(["--prompt", "what is a list?", *args], pair)
    assert json.loads(out)["prompt_ids"] == json.loads(expected)["prompt_ids"]
