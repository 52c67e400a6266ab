"""The engine behind the server: one reply at a time, a bounded number admitted, each reply as the chat makes it.

A request is admitted before its prompt is read (or refused with `Busy` when `max_waiting` are already waiting or
running), its prompt bounded in characters before any tokenizer runs, then waits for the engine and runs on the
calling thread through the chat's own reply loop (session/reply_loop.py): cut at the template's and the request's
stop strings, ended by the repetition guard, capped at `max_tokens` (the server's `--max-tokens` where the request
names none). The engine keeps the KV cache of the last conversation, so a client that resends the whole history
each turn has only its new messages read. A reply's `cancel` (the client went away) halts the engine after the step
in flight; `stop_all` (the server is stopping) halts every reply so.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from specchat.config import Mode, SamplingConfig, SpeculationConfig
from specchat.serve.limits import MAX_TOKENS, MAX_WAITING
from specchat.serve.protocol import Request, RequestError
from specchat.serve.tool_calls import template_takes_tools
from specchat.session.chat import ChatError, render_prompt
from specchat.session.json_mode import JsonConstraint, SchemaError, grammar_for, guidance_tokenizer
from specchat.session.logit_rules import FrequencyPenalty, LogitBias, TopLogprobs
from specchat.session.reply_loop import reply_events
from specchat.speculative.constraint import Constraint, Rules
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.events import ReplyDone, Token

CHARS_PER_TOKEN = 16  # a prompt of more characters than this many per token of the context is refused untokenized


@dataclasses.dataclass(frozen=True)
class Alternatives:
    """The likeliest tokens (text, log p) at the place of the Token just before this event (top_logprobs)."""

    items: list[tuple[str, float]]


class Busy(Exception):
    """Every place in the queue is taken."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one request runs: its prompt's ids and the engine's settings."""

    prompt_ids: list[int]
    sampling: SamplingConfig
    speculation: SpeculationConfig
    stops: tuple[str, ...]
    grammar: str | None = None  # JSON mode's (session/json_mode.py): each reply gets a matcher of its own
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)
    frequency_penalty: float = 0.0
    top_logprobs: int = 0

    def rules(self, tokenizer: Any, engine: Any) -> tuple[Constraint | None, TopLogprobs | None]:
        """What the request changes of the target's logits (speculative/constraint.py), fresh for one reply, and
        what reads the law's likeliest tokens (top_logprobs), which is one of them."""
        start = len(self.prompt_ids)
        rules: list[Constraint] = []
        reader = TopLogprobs(self.top_logprobs, self.sampling) if self.top_logprobs else None
        if self.logit_bias:
            rules.append(LogitBias(self.logit_bias))
        if self.frequency_penalty:
            rules.append(FrequencyPenalty(self.frequency_penalty, start))
        if self.grammar is not None:  # last: a bias never lifts a token the grammar refuses
            rules.append(JsonConstraint(tokenizer, self.grammar, start, engine.eos_ids))
        if reader is not None:  # last: it reads the law the others made
            rules.append(reader)
        return (None if not rules else rules[0] if len(rules) == 1 else Rules(rules)), reader


class Service:
    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        system_prompt: str,
        context_limit: int,
        template_stops: tuple[str, ...] = (),
        max_waiting: int = MAX_WAITING,
        max_tokens: int = MAX_TOKENS,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt  # used where a chat request brings no system message
        self.context_limit = context_limit
        self.template_stops = template_stops
        self.max_waiting = max_waiting
        self.max_tokens = max_tokens
        self._engine_free = threading.Lock()
        self._count = threading.Lock()
        self._tokenizing = threading.Lock()  # one prompt rendered at a time (a fast tokenizer is not re-entrant)
        self.admitted_now = 0
        self.finished: Counter[str] = Counter()  # replies by stop reason (eos, max_tokens, cancelled, ...)
        self.running: set[threading.Event] = set()  # the cancel flags of the replies now running
        self.stopping = threading.Event()  # the server is stopping: no new reply starts

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
        self._bound_characters(request)
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
        changes_law = request.json_mode or request.logit_bias or request.frequency_penalty or request.top_logprobs
        if changes_law and speculation.mode == Mode.DRAFTER:
            raise RequestError("the request's fields read or change the target's law, and drafter mode runs no target")
        cap = request.max_tokens or min(self.max_tokens, room)
        sampling = dataclasses.replace(cfg.sampling, max_new_tokens=cap)
        biased = [token for token in request.logit_bias if token >= self.engine.vocab_size]
        if biased:
            raise RequestError(f"'logit_bias' names token {biased[0]}; the vocabulary has {self.engine.vocab_size}")
        stops = self.template_stops + request.stop
        grammar = self._grammar(request)
        return Plan(
            ids,
            sampling,
            speculation,
            stops,
            grammar,
            request.logit_bias,
            request.frequency_penalty,
            request.top_logprobs,
        )

    def _grammar(self, request: Request) -> str | None:
        if not request.json_mode:
            return None
        try:
            grammar = grammar_for(request.json_schema)
            with self._tokenizing:
                guidance_tokenizer(self.tokenizer)  # built once, before the reply waits for the engine
            return grammar
        except SchemaError as err:
            raise RequestError(f"response_format: {err}") from None

    def _bound_characters(self, request: Request) -> None:
        """Refuse, before any tokenizer runs, a prompt too long in characters for any tokenizing to fit."""
        texts = [request.prompt] if request.prompt is not None else [m["content"] for m in request.messages]
        characters, bound = sum(len(text) for text in texts), self.context_limit * CHARS_PER_TOKEN
        if characters > bound:
            raise RequestError(
                f"the prompt is {characters:,} characters; the context window of {self.context_limit:,} tokens "
                f"takes at most {bound:,} ({CHARS_PER_TOKEN} a token)",
                kind="context_length_exceeded",
            )

    def _prompt_ids(self, request: Request) -> list[int]:
        if request.prompt is not None:
            return list(self.tokenizer.encode(request.prompt))
        messages = [dict(m) for m in request.messages]
        system = "" if any(m["role"] == "system" for m in messages) else self.system_prompt
        if request.tools and not template_takes_tools(self.tokenizer):
            raise RequestError("'tools': this model's chat template has no tools section")
        try:
            return render_prompt(self.tokenizer, system, messages, request.tools)
        except ChatError as err:  # the template failed, or rewrote a message that spells a special token
            raise RequestError(str(err)) from None

    def events(self, plan: Plan, cancel: threading.Event) -> Iterator[Any]:
        """The reply's events (Token, StepDone, ReplyDone, ...) from the chat's reply loop; one reply at a time."""
        with self._engine_free:
            if self.stopping.is_set():
                cancel.set()
            self.running.add(cancel)
            constraint, reader = plan.rules(self.tokenizer, self.engine)
            try:
                for event in reply_events(
                    self.engine, plan.prompt_ids, plan.sampling, plan.speculation, plan.stops, cancel, constraint
                ):
                    if isinstance(event, ReplyDone):
                        self.finished[event.stop_reason] += 1
                    yield event
                    if reader is not None and isinstance(event, Token):
                        yield Alternatives([(self._piece(i), lp) for i, lp in reader.at(event.step, event.position)])
            finally:
                self.running.discard(cancel)

    def _piece(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def stop_all(self) -> None:
        """The server is stopping: every running reply ends after its step in flight, and no new one runs."""
        self.stopping.set()
        for cancel in list(self.running):
            cancel.set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the running reply to end; whether the engine is free."""
        if not self._engine_free.acquire(timeout=timeout_s):
            return False
        self._engine_free.release()
        return True
