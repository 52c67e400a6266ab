"""Rendering captured from rich Consoles: each origin's style, rejected drafts, plain mode, stats text."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from specchat.config import AUTO
from specchat.session.chat import ReplyRecord, SessionTotals
from specchat.speculative.events import Origin, Rejected, ReplyDone, StepDone, Token
from specchat.speculative.metrics import ReplyStats
from specchat.tui import render, stats_view

ESCAPE = re.compile(r"\x1b\[")


def color_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, color_system="truecolor", highlight=False, width=120), out


def sample_stats(**changes) -> ReplyStats:
    stats = ReplyStats(
        mode="spec",
        gamma=4,
        prompt_tokens=30,
        new_tokens=96,
        drafted=88,
        accepted=71,
        draft_steps=22,
        model_steps=22,
        target_only_steps=6,
        model_s=8.0,
        target_only_s=1.8,
        rejections=5,
        target_forwards=28,
        drafter_forwards=88,
        wall_s=9.8,
        ttft_s=0.31,
        target_time_s=2.0,
        drafter_time_s=0.8,
        target_timed=20,
        drafter_timed=80,
        per_position_drafted=[22, 22, 22, 22],
        per_position_accepted=[20, 18, 17, 16],
        accepted_histogram={0: 2, 2: 3, 4: 17},
    )
    for key, value in changes.items():
        setattr(stats, key, value)
    return stats


@pytest.mark.parametrize(
    "origin, ansi",
    [
        (Origin.DRAFTED, "\x1b[32m"),  # green
        (Origin.CORRECTED, "\x1b[1;31m"),  # bold red
        (Origin.BONUS, "\x1b[1;36m"),  # bold cyan
        (Origin.TARGET, "\x1b[35m"),  # magenta
        (Origin.DRAFTER, "\x1b[33m"),  # yellow
    ],
)
def test_each_origin_is_drawn_in_its_own_colour(origin, ansi):
    console, out = color_console()
    render.Renderer(console).event(Token(1, "word", origin))
    assert out.getvalue() == f"{ansi}word\x1b[0m"


def test_rejected_drafts_are_dim_and_struck_only_when_asked():
    console, out = color_console()
    renderer = render.Renderer(console, show_rejected=False)
    renderer.event(Rejected((5, 6), "nope"))
    assert out.getvalue() == ""
    renderer.show_rejected = True
    renderer.event(Rejected((5, 6), "nope"))
    assert "\x1b[2;9m" in out.getvalue() and "nope" in out.getvalue()  # dim + strike


def test_plain_mode_writes_no_escape_codes():
    out = io.StringIO()
    renderer = render.Renderer(render.make_console(False, out), show_rejected=True)
    for origin in Origin:
        renderer.event(Token(1, origin.value + " ", origin))
    renderer.event(Rejected((2,), "bad"))
    renderer.event(StepDone(4, 1))
    renderer.event(ReplyDone(sample_stats(), "text", (1,), "cancelled"))
    renderer.error("an error")
    renderer.info(render.legend("spec", False, True))
    text = out.getvalue()
    assert not ESCAPE.search(text)
    assert text.startswith("⟦drafted ⟧⟨corrected ⟩⦃bonus ⦄target drafter ~~bad~~ ✂ [cut]\n 96 tok")
    assert (
        "an error" in text
        and "legend: ⟦drafted+accepted⟧  ⟨target-corrected⟩  ⦃target-bonus⦄  target-only step (unmarked)" in text
    )


def test_plain_mode_brackets_runs_of_each_origin_and_closes_them_before_anything_else():
    out = io.StringIO()
    renderer = render.Renderer(render.make_console(False, out), show_rejected=True)
    pieces = [
        ("de", Origin.DRAFTED),
        ("f x", Origin.DRAFTED),
        ("", Origin.CORRECTED),
        ("(", Origin.CORRECTED),
        ("y", Origin.TARGET),
        (")", Origin.DRAFTED),
    ]
    for text, origin in pieces:
        renderer.event(Token(1, text, origin))
    renderer.event(Rejected((2,), "bad"))
    renderer.event(Token(1, ":", Origin.CORRECTED))
    renderer.event(Token(1, "\n", Origin.BONUS))
    renderer.event(ReplyDone(sample_stats(), "", (1,), "eos"))
    assert out.getvalue().startswith("⟦def x⟧⟨(⟩y⟦)⟧~~bad~~⟨:⟩⦃\n⦄\n 96 tok")
    unmarked = io.StringIO()
    renderer = render.Renderer(render.make_console(False, unmarked), origin_marks=False)
    renderer.event(Token(1, "de", Origin.DRAFTED))
    renderer.event(Token(1, "f", Origin.BONUS))
    assert unmarked.getvalue() == "def"


def test_the_legend_names_every_colour_the_mode_can_show():
    console, out = color_console()
    console.print(render.Legend("spec"))
    for label in ("drafted+accepted", "target-corrected", "target-bonus", "target-only step"):
        assert label in out.getvalue()
    assert "\x1b[35mtarget-only step" in out.getvalue()  # magenta: the steps auto γ takes without drafts


def test_color_wanted_respects_flag_tty_and_no_color():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert render.color_wanted(True, Tty(), environ={})
    assert not render.color_wanted(True, Tty(), environ={"NO_COLOR": "1"})
    assert not render.color_wanted(False, Tty(), environ={})
    assert not render.color_wanted(True, io.StringIO(), environ={})


def test_set_color_switches_to_plain_and_back():
    console, out = color_console()
    renderer = render.Renderer(console)
    renderer.set_color(False)
    renderer.event(Token(1, "plain", Origin.BONUS))
    renderer.set_color(True)
    renderer.event(Token(1, "bright", Origin.BONUS))
    assert out.getvalue().startswith("⦃plain⦄\x1b[")  # the bracket closes before colour comes back


def test_stats_line_says_the_metrics_as_defined():
    line = render.stats_line(sample_stats(), "eos")
    assert line == " 96 tok · 9.8 tok/s · ttft 0.31 s · accepted 71/88 drafts (81%) · 3.4 tok/step · γ 4"
    assert render.stats_line(sample_stats(), "eos", speedup=1.9).endswith(" · 1.9× vs target")
    auto = render.stats_line(sample_stats(gamma=AUTO), "max_tokens")
    assert "γ auto (≈4.0)" in auto and auto.endswith("hit max tokens (/max)")
    target = render.stats_line(sample_stats(mode="target", drafted=0, accepted=0), "eos")
    assert "target only" in target and "accepted" not in target


def test_legend_lists_the_origins_of_the_mode():
    colour = render.legend("spec", True)
    assert colour.plain.startswith(
        "legend: drafted+accepted  copied+accepted  target-corrected  target-bonus  target-only step"
    )
    assert ("copied+accepted", render.COPIED_STYLE) in [(colour.plain[s.start : s.end], s.style) for s in colour.spans]
    assert render.legend("spec", False).plain.startswith(
        "legend: ⟦drafted+accepted⟧  ⟨target-corrected⟩  ⦃target-bonus⦄  target-only step (unmarked)"
    )
    assert "target-only" in render.legend("target", False).plain
    assert "drafter-only" in render.legend("drafter", False).plain


STATS_SCREEN = """\
last reply  mode spec
tokens      96 new (the end-of-turn token included) · 30 prompt (0 reused from the cache, 0 read)
time        9.80 s · ttft 0.31 s · prompt read in 0.00 s · 9.8 tok/s generating
acceptance  accepted 71/88 drafts (81%) · γ 4
steps       28 target forwards (0 copied, 22 model-drafted, 6 target-only) · 88 drafter forwards · 3.43 tok/step
time split  reading 0.00 s · copies 0.00 s · model drafts 8.00 s · target-only 1.80 s
cost c      0.100 (drafter forward ÷ target forward)
speedup     measured 0.98× (vs one target forward per token) · predicted 3.13× (Leviathan et al., α per draft 0.93, γ 4, c 0.10)
memory      resident memory unknown · target KV cache 0.0 MiB allocated, 126 tokens held
stopped     end of turn

           accepted length per step
drafts kept  steps
0 accepted   ███····················· 2 steps
1 accepted   ························ 0 steps
2 accepted   ████···················· 3 steps
3 accepted   ························ 0 steps
4 accepted   ████████████████████████ 17 steps

          acceptance by draft position
draft       acceptance
position 1  ██████████████████████·· 91% (20/22)
position 2  ████████████████████···· 82% (18/22)
position 3  ███████████████████····· 77% (17/22)
position 4  █████████████████······· 73% (16/22)

session     total
replies     2
tokens      192 in 19.6 s · 9.8 tok/s
acceptance  accepted 142/176 drafts (81%) · 3.43 tok/step"""


def test_stats_detail_shows_exactly_this_screen():
    """measured: 96 tok / 9.8 s at 0.1 s per target forward = 0.98×; c = (0.8 s / 80) / (2.0 s / 20);
    α per draft = 71 / (71 + 5 rejections); predicted (1 − α⁵) / ((1 − α)(4c + 1)) = 3.13×."""
    stats = sample_stats()
    totals = SessionTotals()
    totals.add(stats)
    totals.add(stats)
    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(
        stats_view.stats_detail(ReplyRecord("q", "a", stats, "eos"), totals)
    )
    assert "\n".join(line.rstrip() for line in out.getvalue().splitlines()) == STATS_SCREEN


def test_banner_names_both_models():
    class Facts:
        def __init__(self, name, quantization):
            self.name, self.params, self.dtype, self.quantization = name, 1_540_000_000, "bfloat16", quantization
            self.device, self.memory_bytes, self.load_s = "cpu", 3 * 2**30, 12.5
            self.backend = "lean" if name == "Big" else "transformers (GPTNeoX is not supported)"

    class Pair:
        target_facts, drafter_facts = Facts("Big", "Q4_K_M"), Facts("Small", "Q4_K_M→int8")

    text = render.banner(Pair()).plain
    assert "target Big (1.54B params, Q4_K_M→bfloat16, cpu, lean forward, 3.00 GiB, loaded in 12.5 s)" in text
    assert (
        "drafter Small (1.54B params, Q4_K_M→int8 weights, bfloat16 compute, cpu, "
        "transformers (GPTNeoX is not supported) forward"
    ) in text


def test_thinking_marker_is_erased_by_the_first_token():
    console, out = color_console()
    renderer = render.Renderer(console)
    renderer.begin_reply()
    assert "thinking… (Ctrl-C stops)" in out.getvalue()
    renderer.event(StepDone(4, 0))  # no visible text yet: the marker stays
    assert not out.getvalue().endswith("\x1b[2K")
    renderer.event(Token(1, "Hi", Origin.DRAFTED))
    assert out.getvalue().split("thinking…", 1)[1].split("Hi")[0].endswith("\x1b[1G\x1b[2K\x1b[32m")


def test_no_thinking_marker_when_not_a_terminal():
    out = io.StringIO()
    renderer = render.Renderer(render.make_console(False, out))
    renderer.begin_reply()
    renderer.event(Token(1, "Hi", Origin.TARGET))
    assert out.getvalue() == "Hi"


def test_user_text_in_tables_and_messages_is_not_markup():
    out = io.StringIO()
    renderer = render.Renderer(render.make_console(False, out))
    renderer.info(render.as_table([("user", "slice with s[start:stop:step] or [bold]x[/bold]")], ("a", "b")))
    renderer.info("a [red]message[/red]")
    renderer.event("compare output [x]")
    text = out.getvalue()
    assert "s[start:stop:step] or [bold]x[/bold]" in text
    assert "a [red]message[/red]" in text and "compare output [x]" in text


def test_a_word_that_would_cross_the_right_margin_starts_a_new_line_on_a_terminal():
    """Streamed a token at a time, words are not cut where the terminal wraps: a piece that starts a word past the
    margin starts the next line; piped output stays the exact text."""
    import io

    from rich.console import Console

    pieces = [
        "Speculative",
        " decoding",
        " drafts",
        " tokens",
        " with",
        " a",
        " small",
        " model",
        " and",
        " verifies",
        " them",
        ".",
    ]
    out = io.StringIO()
    renderer = render.Renderer(Console(file=out, force_terminal=True, color_system=None, width=24), origin_marks=False)
    for piece in pieces:
        renderer.event(Token(1, piece, Origin.DRAFTED))
    lines = out.getvalue().split("\n")
    assert all(len(line) <= 24 for line in lines), lines
    assert " ".join(line.strip() for line in lines) == "".join(pieces)
    assert lines[0] == "Speculative decoding"
    piped = io.StringIO()
    plain = render.Renderer(render.make_console(False, piped), origin_marks=False)
    for piece in pieces:
        plain.event(Token(1, piece, Origin.DRAFTED))
    assert piped.getvalue() == "".join(pieces)


def test_copies_stream_in_their_own_colour():
    """A drafted token a copy from the chat wrote (source lookup) is blue, one the drafter model wrote green."""
    out = io.StringIO()
    renderer = render.Renderer(Console(file=out, force_terminal=True, color_system="standard"))
    renderer.event(Token(1, "copied", Origin.DRAFTED, source="lookup"))
    renderer.event(Token(2, "model", Origin.DRAFTED, source="model"))
    text = out.getvalue()
    assert "\x1b[34mcopied" in text and "\x1b[32mmodel" in text


@pytest.mark.parametrize("width", [150, 100, 60, 40, 20])
def test_the_stats_line_breaks_at_its_separators_never_inside_a_word_or_number(width):
    """At 150 columns it once broke inside `γ auto (≈12.0)`, at 60 inside `cancelled`."""
    stats = sample_stats(gamma=AUTO, prefill_tokens=4102, prefill_s=19.3, reused_tokens=1960)
    line = render.stats_line(stats, "cancelled", speedup=1.9)
    fitted = render.fit_to_width(line, width)
    parts = line.split(render.SEPARATOR)
    lines = fitted.split("\n")
    assert [part.strip() for row in lines for part in row.split(render.SEPARATOR)] == [p.strip() for p in parts]
    longest_part = max(len(p) + 1 for p in parts)
    assert all(len(row) <= max(width, longest_part) for row in lines)
    assert render.fit_to_width(line, 0) == line  # a pipe: one line
    if width >= len(line):
        assert fitted == line
