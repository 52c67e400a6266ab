"""/compare: on|off|drafter side by side (a setting), and the races on the last prompt (drafters, gamma)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from specchat.config import Mode
from specchat.session.chat import ChatSession
from specchat.session.drafter_race import (
    NO_DRAFTER,
    RACE_RUNS,
    Contender,
    RaceRun,
    drafter_contenders,
    gamma_contenders,
    parse_gammas,
    race,
    race_seconds,
)
from specchat.speculative.drafters import registry as kinds
from specchat.speculative.drafters.registry import drafter_needed
from specchat.tui.commands.registry import Command, Outcome, fail
from specchat.tui.commands.values import show_or_set
from specchat.tui.compare_view import RaceSubject, race_view


def cmd_compare(session: ChatSession, arg: str) -> Outcome:
    if arg == "drafters":
        return cmd_compare_drafters(session)
    if arg.split(" ", 1)[0] == "gamma":
        return cmd_compare_gamma(session, arg[len("gamma") :].strip())
    if arg and drafter_needed(session.has_drafter, Mode.TARGET, arg):
        return fail("/compare: 'drafter' needs a drafter model, and none is loaded; use /compare on")
    outcome = show_or_set(session, "compare", "speculation.compare", "on|off|drafter", arg)
    if arg and session.compare_fn is None and session.config.speculation.compare != "off":
        return Outcome(f"{outcome.message} (recorded; this build has no side-by-side runner yet)")
    return outcome


def cmd_compare_drafters(session: ChatSession) -> Outcome:
    if not session.records:
        return fail("/compare: no reply yet: /compare drafters reruns the last prompt with each drafter")
    ways = drafter_contenders(session)
    subject = RaceSubject(current=session.config.speculation.drafter)
    return race_outcome(session, ways, subject, "drafters", f"{len(ways)} ways ({', '.join(w.name for w in ways)})")


def cmd_compare_gamma(session: ChatSession, arg: str) -> Outcome:
    if not session.records:
        return fail("/compare: no reply yet: /compare gamma reruns the last prompt at each γ")
    if not session.has_drafter and kinds.needs_model(session.config.speculation.drafter):
        return fail("/compare gamma: the drafter model is not loaded; pick another with /drafter lookup or self:N")
    try:
        gammas = parse_gammas(arg)
    except ValueError as err:
        return fail(f"/compare gamma: {err}")
    ways = gamma_contenders(session, gammas)
    gamma = session.config.speculation.gamma
    subject = RaceSubject("γ", str(gamma), "/gamma", "γ ")
    listed = ", ".join(way.name for way in ways[1:])
    return race_outcome(session, ways, subject, "gamma", f"γ {listed} and the target alone, greedy,", greedy=True)


def race_outcome(
    session: ChatSession, ways: list[Contender], subject: RaceSubject, what: str, listed: str, greedy: bool = False
) -> Outcome:
    """The race's first line (what runs, about how long it takes) and its work."""
    seconds = race_seconds(session, len(ways))
    return Outcome(
        f"racing {listed} on the last prompt, {RACE_RUNS} short runs each: about {duration_text(seconds)}; "
        f"Ctrl-C stops",
        work=lambda cancel: race_lines(session, cancel, ways, subject, what, greedy),
    )


def duration_text(seconds: float) -> str:
    """`40 s`, `3 min`."""
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"


def race_lines(
    session: ChatSession, cancel: threading.Event, ways: list[Contender], subject: RaceSubject, what: str, greedy: bool
) -> Iterator[Any]:
    """/compare drafters or gamma as it runs: one line per finished run, then the table (or why not)."""
    total, finished, results = len(ways) * RACE_RUNS, 0, []
    for item in race(session, cancel, ways=ways, greedy=greedy):
        if isinstance(item, RaceRun):
            results.append(item)
            continue
        finished += 1
        yield f"  {finished}/{total} {subject.label if item[0] != NO_DRAFTER else ''}{item[0]}: " + (
            f"{item[1].generation_tokens_per_s:.1f} tok/s"
        )
    yield race_view(results, subject) if finished == total else f"/compare {what}: cancelled; nothing changed"


def race_commands() -> list[Command]:
    return [
        Command(
            "compare",
            "on|off|drafter|drafters|gamma [LIST]",
            "also run each prompt target-only (or drafter-only) side by side; drafters: race every "
            "drafter on the last prompt; gamma 1,2,4,auto: race those γs on it (greedy)",
            cmd_compare,
            {"on": None, "off": None, "drafter": None, "drafters": None, "gamma": None},
        ),
    ]
