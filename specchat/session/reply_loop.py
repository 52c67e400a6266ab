"""One reply's events as the chat and the server both run them: the engine's stream, cut before the first stop
string, ended by the repetition guard, halted by the caller's cancel flag.

The engine is halted through its cancel flag after the step that wrote a stop string or closed a loop, so its caches
stay as after any cancel; the next prompt (rendered from the cut text) replaces the tokens after the cut, since the
engine reuses only the ids the new prompt really shares.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.session.repetition import REPETITION, RepetitionGuard
from specchat.session.stop_strings import StopFilter, StopOrCancel
from specchat.speculative.constraint import Constraint
from specchat.speculative.events import ReplyDone, Token


def reply_events(
    engine: Any,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    speculation: SpeculationConfig,
    stops: tuple[str, ...],
    cancel: threading.Event,
    constraint: Constraint | None = None,
) -> Iterator[Any]:
    """The engine's events for one reply (Token, StepDone, ..., ReplyDone), cut at `stops` and at a loop of
    `sampling.repetition_stop` tokens (stop reason "repetition"); `cancel` ends it after the step in flight;
    `constraint` masks the target's law (JSON mode)."""
    stop_filter, halt = StopFilter(stops), StopOrCancel(cancel)
    guard = RepetitionGuard(sampling.repetition_stop)
    for event in engine.stream(prompt_ids, sampling, speculation, halt, constraint):
        if isinstance(event, Token) and guard.add(event.id):
            halt.stopped.set()  # the engine stops after this step; the reply keeps what it wrote
        if isinstance(event, ReplyDone) and guard.looping and event.stop_reason == "cancelled" and not cancel.is_set():
            event = dataclasses.replace(event, stop_reason=REPETITION)
        yield from stop_filter.feed(event)
        if stop_filter.cut:
            halt.stopped.set()
