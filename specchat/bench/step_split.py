"""Where a whole speculative step's time goes, in a real reply: the target's verification forward, the drafter's
forwards (its catch-up included), the rule and the step's one read, committing, and what is left (Python between).

    python -m specchat.bench.profile --steps [--gamma 4] [--tokens 128] [key=value ...]

One reply is run first untimed (warm-up), then one timed with stopwatches on the functions below; a step's time is
the wall time between two StepDone events of Engine.stream (what the chat runs, detokenizing included).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from specchat.bench.part_timing import timed_function
from specchat.config import Mode, SamplingConfig, SpeculationConfig
from specchat.speculative import conversation, reply, step
from specchat.speculative.drafters import model
from specchat.speculative.engine import Engine
from specchat.speculative.events import StepDone

FORWARDS = ("target forward", "drafter forwards")
PARTS = (
    *FORWARDS,
    "drafter, beyond its forwards",
    "rule and read-back",
    "commit and roll back",
    "γ policy and stats",
    "other (events, detokenizing, the loop)",
)


@contextmanager
def counted_drafter_rows(seconds: dict[str, float]) -> Iterator[None]:
    """Count the drafter's forwards and the rows they read (a catch-up forward reads more than one) into seconds
    under "drafter forwards (count)" and "drafter rows (count)"."""
    original = model.ModelDrafter._draft_forward

    def counted(self: Any, feed: Any, guess: list[int], drafting: Any) -> None:
        seconds["drafter forwards (count)"] += 1
        seconds["drafter rows (count)"] += feed.shape[0] + len(guess)
        original(self, feed, guess, drafting)

    model.ModelDrafter._draft_forward = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        model.ModelDrafter._draft_forward = original  # type: ignore[method-assign]


@contextmanager
def stopwatches(seconds: dict[str, float]) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(counted_drafter_rows(seconds))
        stack.enter_context(timed_function(step, "_score", seconds, "target forward"))
        stack.enter_context(timed_function(step, "_verdict", seconds, "rule and read-back"))
        stack.enter_context(timed_function(step, "token_probs", seconds, "rule and read-back"))
        stack.enter_context(timed_function(step, "read_back", seconds, "rule and read-back"))
        stack.enter_context(timed_function(model.ModelDrafter, "_draft_forward", seconds, "drafter forwards"))
        drafter_rest = "drafter, beyond its forwards"
        stack.enter_context(
            timed_function(model.ModelDrafter, "propose", seconds, drafter_rest, nested="drafter forwards")
        )
        stack.enter_context(timed_function(reply, "committed", seconds, "commit and roll back"))
        stack.enter_context(timed_function(reply, "refusal_record", seconds, "commit and roll back"))
        stack.enter_context(timed_function(conversation.Conversation, "append", seconds, "commit and roll back"))
        stack.enter_context(timed_function(reply, "draft_plan", seconds, "γ policy and stats"))
        stack.enter_context(timed_function(reply.StatsRecorder, "record", seconds, "γ policy and stats"))
        yield


def step_times(engine: Engine, ids: list[int], sampling: SamplingConfig, speculation: SpeculationConfig) -> list[float]:
    """Seconds of each step of one reply, StepDone to StepDone (the first from the end of the prompt's reading)."""
    times, mark = [], time.perf_counter()
    for event in engine.stream(ids, sampling, speculation):
        if isinstance(event, StepDone):
            now = time.perf_counter()
            times.append(now - mark)
            mark = now
        elif type(event).__name__ == "PrefillProgress":
            mark = time.perf_counter()
    return times


def split_steps(
    engine: Engine, ids: list[int], gamma: int, tokens: int, settings: SpeculationConfig = SpeculationConfig()
) -> tuple[dict[str, float], int, float]:
    """Mean ms a step per part over one timed reply (after a warm-up one), the steps, and tokens a step: the drafter
    model drafting `gamma` tokens a step, with the rest of `settings` (the drafter's vocabulary, ...)."""
    sampling = SamplingConfig(max_new_tokens=tokens)
    speculation = dataclasses.replace(settings, gamma=gamma, mode=Mode.SPEC, drafter="model")
    step_times(engine, ids, sampling, speculation)  # warm-up: the caches and the kernels' first calls
    engine.reset()
    seconds: dict[str, float] = defaultdict(float)
    policy = timed_function(type(engine.policy), "observe_step", seconds, "γ policy and stats")
    with stopwatches(seconds), policy:
        times = step_times(engine, ids, sampling, speculation)
    total = sum(times)
    steps = len(times)
    split = {part: seconds.get(part, 0.0) / steps * 1e3 for part in PARTS[:-1]}
    split[PARTS[-1]] = total / steps * 1e3 - sum(split.values())
    counts = {
        "drafter forwards a step": seconds["drafter forwards (count)"] / steps,
        "rows a drafter forward": seconds["drafter rows (count)"] / max(1.0, seconds["drafter forwards (count)"]),
    }
    return (
        split | counts | {"step": total / steps * 1e3, "median step": statistics.median(times) * 1e3},
        steps,
        tokens / steps,
    )


def split_table(split: dict[str, float], steps: int, per_step: float) -> str:
    total = split["step"]
    lines = [
        f"{steps} steps, {per_step:.2f} tokens a step; mean step {total:.1f} ms (median {split['median step']:.1f})",
        "",
        "| part | ms a step | share |",
        "|---|---|---|",
    ]
    lines += [f"| {part} | {split[part]:.2f} | {split[part] / total:.1%} |" for part in PARTS]
    beyond = total - sum(split[part] for part in FORWARDS)
    lines.append(f"| beyond the forwards | {beyond:.2f} | {beyond / total:.1%} |")
    forwards, rows = split["drafter forwards a step"], split["rows a drafter forward"]
    each = split["drafter forwards"] / forwards if forwards else 0.0
    lines += ["", f"{forwards:.2f} drafter forwards a step of {rows:.2f} rows each, {each:.2f} ms each"]
    return "\n".join(lines)


def report(pair: Any, ids: list[int], gamma: int, tokens: int, settings: SpeculationConfig) -> str:
    engine = Engine.for_pair(pair)
    split, steps, per_step = split_steps(engine, ids, gamma, tokens, settings)
    return split_table(split, steps, per_step)
