"""/compare drafters and /compare gamma: rerun the last prompt each way (every drafter, or every γ of a list), and
with no drafter, side by side.

Every run gets a fresh engine on the same loaded models (empty caches, a copy of the chat's gamma
policy) and the same seed, so the chat's history and caches are untouched and the runs are fair.
Each contender runs RACE_RUNS short runs (at most RACE_TOKENS new tokens), taken in turns so a busy
machine slows them all alike; its rate is the median generation tok/s and its spread the runs' min–max.
A contender is the winner only when its slowest run beats every other's fastest (spreads apart), and
one that accepted no draft never beats the target alone: it did the target's work plus drafting.
The γ sweep samples greedily whatever the chat's settings, so every γ writes the same text.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from specchat.config import AUTO, GAMMA_MAX, Gamma, Mode, SpeculationConfig, seed_for_reply
from specchat.speculative.drafters import registry as kinds
from specchat.speculative.drafters.registry import default_name
from specchat.speculative.engine import Engine, run_to_end
from specchat.speculative.metrics import ReplyStats

NO_DRAFTER = "none"
RACE_RUNS = 3  # runs per contender: enough for a spread, short enough to wait for
RACE_TOKENS = 64  # new tokens a run may write at most (the reply's own cap when that is lower)
SWEEP_GAMMAS: tuple[Gamma, ...] = (1, 2, 4, 6, 8, AUTO)  # /compare gamma's γs when none are named
SWEEP_MAX = 8  # γs one sweep takes at most


@dataclass(frozen=True)
class Contender:
    """One way to answer: its name in the table (a drafter, a γ, or none) and the speculation settings it runs."""

    name: str
    speculation: SpeculationConfig


@dataclass(frozen=True)
class RaceRun:
    """One contender's runs; `stats` is its first run (acceptance and steps repeat with the seed)."""

    name: str  # a drafter (model | lookup | auto | self:N), a γ (1..16 | auto), or none: the target alone
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
    base = next((r.rate for r in runs if r.name == NO_DRAFTER), 0.0)
    return run.rate / base if base else 0.0


def winner(runs: list[RaceRun]) -> RaceRun | None:
    """The contender faster than every other beyond the measured spreads; None for a tie. A drafter that
    accepted nothing is never preferred to the target alone."""
    eligible = [run for run in runs if run.name == NO_DRAFTER or run.accepted_any]
    if not eligible:
        return None
    best = max(eligible, key=lambda run: run.rate)
    beaten = all(best.spread[0] > other.spread[1] for other in runs if other is not best)
    return best if beaten else None


def contenders(engine: Engine, current: str) -> list[str]:
    """None, then every kind of drafter that can draft here (speculative/drafters/registry.py): one that takes a number as the
    current name where it is that kind's, else with the number a race tries (self:N: a quarter of the layers).
    With no drafter model, auto is lookup alone and is left out."""
    parsed = kinds.parse(current)
    names = [NO_DRAFTER]
    for kind in kinds.KINDS:
        if kind.name == "auto" and not engine.has_model_drafter:
            continue
        name = current if parsed and parsed[0] is kind else default_name(kind, engine.drafters.setup)
        names += [name] if engine.drafter_problem(name) is None else []
    return names


def drafter_contenders(session) -> list[Contender]:
    """None, then every drafter that can draft here (contenders), each at the chat's γ."""
    speculation = session.config.speculation
    names = contenders(session.engine, speculation.drafter)
    return [_contender(name, speculation) for name in names]


def gamma_contenders(session, gammas: tuple[Gamma, ...] = SWEEP_GAMMAS) -> list[Contender]:
    """None, then the chat's drafter at each γ."""
    speculation = dataclasses.replace(session.config.speculation, mode=Mode.SPEC)
    sweep = [Contender(str(gamma), dataclasses.replace(speculation, gamma=gamma)) for gamma in gammas]
    return [_contender(NO_DRAFTER, speculation), *sweep]


def parse_gammas(text: str) -> tuple[Gamma, ...]:
    """'1,2,4 auto' → (1, 2, 4, AUTO): each 1..GAMMA_MAX or auto, at most SWEEP_MAX, in order, once each; ValueError
    saying what is allowed."""
    words = text.replace(",", " ").split()
    gammas: list[Gamma] = []
    for word in words:
        gamma = AUTO if word.lower() == "auto" else int(word) if word.isdigit() else None
        if gamma is None or (gamma is not AUTO and not 1 <= gamma <= GAMMA_MAX):
            raise ValueError(f"each γ is an integer from 1 to {GAMMA_MAX} or auto, not {word[:20]!r}")
        if gamma not in gammas:
            gammas.append(gamma)
    if len(gammas) > SWEEP_MAX:
        raise ValueError(f"at most {SWEEP_MAX} γs a sweep, not {len(gammas)}")
    return tuple(gammas) or SWEEP_GAMMAS


def _contender(name: str, speculation: SpeculationConfig) -> Contender:
    if name == NO_DRAFTER:
        return Contender(name, dataclasses.replace(speculation, mode=Mode.TARGET, drafter="model"))
    return Contender(name, dataclasses.replace(speculation, mode=Mode.SPEC, drafter=name))


def race_sampling(session, greedy: bool = False):
    """The chat's sampling (greedy: at temperature 0) with one seed for every run and at most RACE_TOKENS new
    tokens a run."""
    cfg = session.config
    seed = seed_for_reply(cfg.sampling.seed)
    sampling = session.sampling_for(session.last_prompt_ids)
    sampling = dataclasses.replace(sampling, seed=seed, max_new_tokens=min(sampling.max_new_tokens, RACE_TOKENS))
    return dataclasses.replace(sampling, temperature=0.0) if greedy else sampling


def race_seconds(session, contenders_count: int) -> float:
    """About how long a race of `contenders_count` takes, from the last reply's rates: each run reads the prompt
    anew and writes up to RACE_TOKENS tokens."""
    stats = session.records[-1].stats
    prompt = stats.prompt_tokens / stats.prefill_tokens_per_s if stats.prefill_tokens_per_s else stats.prefill_s
    tokens = min(stats.new_tokens, race_sampling(session).max_new_tokens)
    writing = tokens / stats.generation_tokens_per_s if stats.generation_tokens_per_s else 0.0
    return contenders_count * RACE_RUNS * (prompt + writing)


def one_run(session, contender: Contender, sampling, cancel: threading.Event) -> ReplyStats | None:
    """One contender's run on a fresh engine; None when cancelled."""
    final = run_to_end(session.engine.fork().steps(session.last_prompt_ids, sampling, contender.speculation, cancel))
    return None if final is None or final.stop_reason == "cancelled" else final.stats


def race(
    session,
    cancel: threading.Event,
    rounds: int = RACE_RUNS,
    ways: list[Contender] | None = None,
    greedy: bool = False,
) -> Iterator[tuple[str, ReplyStats] | RaceRun]:
    """Each run as it finishes, as (name, stats), round after round; then one RaceRun per contender, the target
    alone first. `ways`: the drafters' (drafter_contenders) unless given. Stops early when `cancel` is set.
    Raises ValueError before any reply."""
    if not session.records:
        raise ValueError("no reply yet: /compare reruns the last prompt each way")
    sampling = race_sampling(session, greedy)
    ways = ways if ways is not None else drafter_contenders(session)
    done: dict[str, list[ReplyStats]] = {way.name: [] for way in ways}
    for _ in range(rounds):
        for way in ways:
            stats = one_run(session, way, sampling, cancel)
            if stats is None:
                return
            done[way.name].append(stats)
            yield way.name, stats
    yield from (RaceRun(name, tuple(runs)) for name, runs in done.items())
