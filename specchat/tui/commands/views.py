"""The commands that show a reply another way: /legend, /show rejected, /stats, /why and /view."""

from __future__ import annotations

from specchat.config import VIEWS, Mode
from specchat.safe_text import visible
from specchat.session.chat import ChatSession
from specchat.settings import with_value
from specchat.speculative.gamma import AutoGamma, gamma_curve
from specchat.tui import render, stats_view
from specchat.tui.commands.registry import Command, Outcome, fail
from specchat.tui.commands.values import apply_setting, shown
from specchat.tui.reply_view import OriginView, markdown_view
from specchat.tui.why_view import why


def cmd_legend(session: ChatSession, arg: str) -> Outcome:
    ui = session.config.ui
    return Outcome(render.Legend(session.config.speculation.mode, ui.show_rejected, ui.origin_marks))


def cmd_show(session: ChatSession, arg: str) -> Outcome:
    subject, _, value = arg.partition(" ")
    if subject != "rejected":
        return fail("/show: usage /show rejected on|off")
    if not value:
        return Outcome(f"ui.show_rejected is {shown('ui.show_rejected', session.config.ui.show_rejected)}")
    if value.strip().lower() not in ("on", "off"):
        return fail(f"/show rejected: must be on or off, got '{value.strip()}'")
    return apply_setting(session, "ui.show_rejected", value)


def cmd_stats(session: ChatSession, arg: str) -> Outcome:
    if not session.records:
        return Outcome("no reply yet: /stats describes the last reply")
    from specchat.kernels.build import running_path

    policy, speculation = getattr(session.engine, "policy", None), session.config.speculation
    drafting = isinstance(policy, AutoGamma) and speculation.mode is Mode.SPEC
    curve = gamma_curve(policy) if drafting else None
    detail = stats_view.stats_detail(session.records[-1], session.totals, running_path(), curve, speculation.gamma)
    return Outcome(detail)


def cmd_why(session: ChatSession, arg: str) -> Outcome:
    try:
        return Outcome(why(session, arg.strip()))
    except ValueError as err:
        return fail(str(err))


def cmd_view(session: ChatSession, arg: str) -> Outcome:
    if arg not in VIEWS:
        return fail(f"/view: usage /view {'|'.join(VIEWS)} (now {session.config.ui.view})")
    session.config = with_value(session.config, "ui.view", arg)
    if not session.records:
        return Outcome(f"ui.view = {arg}: replies show as {arg} once done")
    record = session.records[-1]
    if arg == "markdown":
        return Outcome(
            render.group(render.Text("ui.view = markdown; the last reply:", style="dim"), markdown_view(record.text))
        )
    if not record.tokens:
        return Outcome(
            render.group(
                render.Text("ui.view = origin; the last reply (loaded: its origins were not saved):", style="dim"),
                render.Text(visible(record.text)),
            )
        )
    return Outcome(
        render.group(render.Text("ui.view = origin; the last reply:", style="dim"), OriginView(record.tokens))
    )


def view_commands() -> list[Command]:
    return [
        Command("legend", "", "what each colour (or bracket) of the stream means", cmd_legend),
        Command(
            "show",
            "rejected on|off",
            "show rejected drafts dim and struck through",
            cmd_show,
            {"rejected": {"on": None, "off": None}},
        ),
        Command("stats", "", "the last reply in detail, and session totals", cmd_stats),
        Command("why", "[N]", "the last reply's rejected drafts: p, q, min(1, p/q), each model's top 5", cmd_why),
        Command(
            "view",
            "markdown|origin",
            "show the last reply (and later ones) as Markdown with highlighted code, or coloured by origin",
            cmd_view,
            {"markdown": None, "origin": None},
        ),
    ]
