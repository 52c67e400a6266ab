"""The engine behind the server: one reply at a time, a bounded number admitted, each reply as the chat makes it.

A request is admitted (or refused with `Busy` when `max_waiting` are already waiting or running), waits for the
engine, and runs on the calling thread: its events are the engine's, cut at the template's and the request's stop
strings as the chat cuts them. The engine keeps the KV cache of the last conversation, so a client that resends
the whole history each turn has only its new messages read. A reply's `cancel` (the client went away) halts the
engine after the step in flight.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from specchat.config import Mode, SamplingConfig, SpeculationConfig, drafter_needed
from specchat.serve.protocol import Request, RequestError
from specchat.session.chat import TemplateFailure, render_prompt
from specchat.session.stop_strings import StopFilter, StopOrCancel
from specchat.speculative.events import ReplyDone

MAX_WAITING = 8  # requests admitted at once (one runs, the rest wait); more are answered 429


class Busy(Exception):
    """Every place in the queue is taken."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one request runs: its prompt's ids and the engine's settings."""

    prompt_ids: list[int]
    sampling: SamplingConfig
    speculation: SpeculationConfig
    stops: tuple[str, ...]


class Service:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        system_prompt: str,
        context_limit: int,
        template_stops: tuple[str, ...] = (),
        max_waiting: int = MAX_WAITING,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt  # used where a chat request brings no system message
        self.context_limit = context_limit
        self.template_stops = template_stops
        self.max_waiting = max_waiting
        self._engine_free = threading.Lock()
        self._count = threading.Lock()
        self._tokenizing = threading.Lock()  # one prompt rendered at a time (a fast tokenizer is not re-entrant)
        self.admitted_now = 0
        self.finished: Counter[str] = Counter()  # replies by stop reason (eos, max_tokens, cancelled, ...)

    def admit(self) -> Callable[[], None]:
        """Take a place in the queue (Busy when there is none); returns what gives it back, once."""
        with self._count:
            if self.admitted_now >= self.max_waiting:
                raise Busy()
            self.admitted_now += 1
        given_back = threading.Event()

        def release() -> None:
            with self._count:
                if not given_back.is_set():
                    given_back.set()
                    self.admitted_now -= 1

        return release

    def plan(self, request: Request) -> Plan:
        """The prompt's ids and settings, checked against the context window before any forward."""
        with self._tokenizing:
            ids = self._prompt_ids(request)
        room = self.context_limit - len(ids)
        if room < 1:
            raise RequestError(
                f"the prompt is {len(ids)} tokens; the context window holds {self.context_limit}",
                kind="context_length_exceeded",
            )
        if request.max_tokens > room:
            raise RequestError(
                f"max_tokens {request.max_tokens} does not fit: the prompt is {len(ids)} of the context's "
                f"{self.context_limit} tokens, {room} are left",
                kind="context_length_exceeded",
            )
        cfg = request.config
        speculation = cfg.speculation
        problem = drafter_needed(self.engine.has_model_drafter, speculation.mode, drafter=speculation.drafter)
        problem = problem or (
            self.engine.drafter_problem(speculation.drafter) if speculation.mode == Mode.SPEC else None
        )
        if problem:
            raise RequestError(f"drafter: {problem}")
        sampling = dataclasses.replace(cfg.sampling, max_new_tokens=request.max_tokens or room)
        return Plan(ids, sampling, speculation, self.template_stops + request.stop)

    def _prompt_ids(self, request: Request) -> list[int]:
        if request.prompt is not None:
            return list(self.tokenizer.encode(request.prompt))
        messages = [dict(m) for m in request.messages]
        system = "" if any(m["role"] == "system" for m in messages) else self.system_prompt
        try:
            return render_prompt(self.tokenizer, system, messages)
        except TemplateFailure as err:
            raise RequestError(str(err)) from None

    def events(self, plan: Plan, cancel: threading.Event) -> Iterator[Any]:
        """The reply's events (Token, StepDone, ReplyDone, ...), cut at the stop strings; one reply at a time."""
        with self._engine_free:
            stops, halt = StopFilter(plan.stops), StopOrCancel(cancel)
            for event in self.engine.stream(plan.prompt_ids, plan.sampling, plan.speculation, halt):
                for shown in stops.feed(event):
                    if isinstance(shown, ReplyDone):
                        self.finished[shown.stop_reason] += 1
                    yield shown
                if stops.cut:
                    halt.stopped.set()
