"""/compare drafters: rerun the last prompt with each available drafter, and with none, side by side.

Every run gets a fresh engine on the same loaded models (empty caches, a copy of the chat's gamma
policy) and the same seed, so the chat's history and caches are untouched and the runs are fair.
Each contender runs RACE_RUNS short runs (at most RACE_TOKENS new tokens), taken in turns so a busy
machine slows them all alike; its rate is the median generation tok/s and its spread the runs' min–max.
A contender is the winner only when its slowest run beats every other's fastest (spreads apart), and
one that accepted no draft never beats the target alone: it did the target's work plus drafting.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from specchat import drafter_kinds
from specchat.config import Mode, seed_for_reply
from specchat.speculative.drafters.registry import default_name
from specchat.speculative.engine import Engine, run_to_end
from specchat.speculative.metrics import ReplyStats

NO_DRAFTER = "none"
RACE_RUNS = 3  # runs per contender: enough for a spread, short enough to wait for
RACE_TOKENS = 64  # new tokens a run may write at most (the reply's own cap when that is lower)


@dataclass(frozen=True)
class RaceRun:
    """One contender's runs; `stats` is its first run (acceptance and steps repeat with the seed)."""

    drafter: str  # model | lookup | auto | self:N | none (the target alone)
    runs: tuple[ReplyStats, ...]

    @property
    def stats(self) -> ReplyStats:
        return self.runs[0]

    @property
    def rates(self) -> list[float]:
        return sorted(run.generation_tokens_per_s for run in self.runs)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> tuple[float, float]:
        return self.rates[0], self.rates[-1]

    @property
    def accepted_any(self) -> bool:
        return any(run.accepted for run in self.runs)


def speedup(run: RaceRun, runs: list[RaceRun]) -> float:
    """`run`'s median rate over the target alone's median rate."""
    base = next((r.rate for r in runs if r.drafter == NO_DRAFTER), 0.0)
    return run.rate / base if base else 0.0


def winner(runs: list[RaceRun]) -> RaceRun | None:
    """The contender faster than every other beyond the measured spreads; None for a tie. A drafter that
    accepted nothing is never preferred to the target alone."""
    eligible = [run for run in runs if run.drafter == NO_DRAFTER or run.accepted_any]
    if not eligible:
        return None
    best = max(eligible, key=lambda run: run.rate)
    beaten = all(best.spread[0] > other.spread[1] for other in runs if other is not best)
    return best if beaten else None


def contenders(engine: Engine, current: str) -> list[str]:
    """None, then every kind of drafter that can draft here (drafter_kinds.py): one that takes a number as the
    current name where it is that kind's, else with the number a race tries (self:N: a quarter of the layers).
    With no drafter model, auto is lookup alone and is left out."""
    parsed = drafter_kinds.parse(current)
    names = [NO_DRAFTER]
    for kind in drafter_kinds.KINDS:
        if kind.name == "auto" and not engine.has_model_drafter:
            continue
        name = current if parsed and parsed[0] is kind else default_name(kind, engine.setup)
        names += [name] if engine.drafter_problem(name) is None else []
    return names


def race_sampling(session):
    """The chat's sampling with one seed for every run and at most RACE_TOKENS new tokens a run."""
    cfg = session.config
    seed = seed_for_reply(cfg.sampling.seed)
    sampling = session.sampling_for(session.last_prompt_ids)
    return dataclasses.replace(sampling, seed=seed, max_new_tokens=min(sampling.max_new_tokens, RACE_TOKENS))


def one_run(session, name: str, sampling, cancel: threading.Event) -> ReplyStats | None:
    """One contender's run on a fresh engine; None when cancelled."""
    mode, drafter = (Mode.TARGET, "model") if name == NO_DRAFTER else (Mode.SPEC, name)
    speculation = dataclasses.replace(session.config.speculation, mode=mode, drafter=drafter)
    final = run_to_end(session.engine.fork().steps(session.last_prompt_ids, sampling, speculation, cancel))
    return None if final is None or final.stop_reason == "cancelled" else final.stats


def race(session, cancel: threading.Event, rounds: int = RACE_RUNS) -> Iterator[tuple[str, ReplyStats] | RaceRun]:
    """Each run as it finishes, as (drafter, stats), round after round; then one RaceRun per contender, the
    target alone first. Stops early when `cancel` is set. Raises ValueError before any reply."""
    if not session.records:
        raise ValueError("no reply yet: /compare drafters reruns the last prompt with each drafter")
    sampling = race_sampling(session)
    names = contenders(session.engine, session.config.speculation.drafter)
    done: dict[str, list[ReplyStats]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            stats = one_run(session, name, sampling, cancel)
            if stats is None:
                return
            done[name].append(stats)
            yield name, stats
    yield from (RaceRun(name, tuple(runs)) for name, runs in done.items())
