"""ChatSession: the conversation, the chat template, the context budget and each reply's record.

The prompt is re-rendered from the whole history every turn with the tokenizer's chat template.
The rendering of earlier turns never changes, so the new prompt ids extend the ids the engine
already holds and the engine reuses its KV caches for that common prefix.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specchat.config import RANDOM, Config, Mode, SamplingConfig, undecodable_at
from specchat.session.literal_text import LiteralTextError, literal_ids
from specchat.session.repetition import REPETITION
from specchat.session.reply_loop import reply_events
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.events import Rejected, ReplyDone, Token
from specchat.speculative.insight import Rejection
from specchat.speculative.metrics import ReplyStats

# compare_fn(session, prompt_ids, done, cancel) -> renderables/events to show after a reply.
# specchat/session/compare.py provides it; without it, compare mode only records the setting.
CompareFn = Callable[["ChatSession", list[int], ReplyDone, threading.Event], Iterable[Any]]

CONTEXT_FULL = "context_full"  # an uncapped reply that filled the context window (the session's stop reason)
HINT_STEPS, HINT_ACCEPTANCE = 8, 0.1  # a drafter hint needs this many model-drafted steps, this acceptance or less
REPLY_RESERVE = 1024  # with no /max cap, the least room a prompt leaves for the reply (a quarter of a smaller window)
CUT_MARKS = {  # how a reply that did not reach its end of turn is marked in the stream, /history and /save
    "cancelled": "✂ [cut]",
    "max_tokens": "✂ [cut: /max reached]",
    CONTEXT_FULL: "✂ [cut: context window full]",
    REPETITION: "✂ [cut: the reply was repeating itself]",
}


def render_prompt(
    tokenizer, system_prompt: str, messages: list[dict[str, Any]], tools: list | None = None
) -> list[int]:
    """Token ids of the system prompt (if any) + messages + the assistant's generation prompt, in the
    tokenizer's chat template (with `tools` for a template that takes them). The chat, the server and the
    benchmark all build their prompts here. A template that rejects the system role (gemma's) gets the system
    text at the top of the first user turn. A template that fails any other way (its own raise_exception, a
    syntax or sandbox error, a range too big) is a TemplateFailure: one line, the template's words quoted."""
    try:
        return _render(tokenizer, system_prompt, messages, tools)
    except ChatError:
        raise
    except Exception as err:  # the template is a GGUF's or a folder's text: anything it does is the file's fault
        words = " ".join(str(err).split())[:TEMPLATE_WORDS]
        raise TemplateFailure(f"the model's chat template failed: {type(err).__name__}: {words}") from None


TEMPLATE_WORDS = 200  # characters of a template's error quoted


def _render(tokenizer, system_prompt: str, messages: list[dict[str, Any]], tools: list | None) -> list[int]:
    from jinja2 import TemplateError

    conversation = [{"role": "system", "content": system_prompt}] if system_prompt else []
    try:
        return _encode(tokenizer, conversation + messages, tools)
    except TemplateError:
        if not system_prompt:
            raise
        return _encode(tokenizer, _system_folded(system_prompt, messages), tools)


def _system_folded(system_prompt: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    folded = [dict(message) for message in messages]
    first_user = next((m for m in folded if m["role"] == "user"), None)
    if first_user is None:
        return [{"role": "user", "content": system_prompt}] + folded
    first_user["content"] = f"{system_prompt}\n\n{first_user['content']}"
    return folded


def _encode(tokenizer, conversation: list[dict[str, Any]], tools: list | None = None) -> list[int]:
    """The conversation's ids; a message that spells a special token has it read as text (literal_text.py)."""
    options = {"tools": tools} if tools else {}
    try:
        literal = literal_ids(tokenizer, conversation, **options)
    except LiteralTextError as err:
        raise ChatError(str(err)) from None
    if literal is not None:
        return literal
    encoded = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=True, **options
    )
    return list(encoded["input_ids"])


class ChatError(ValueError):
    """A message for the user (one line) about something a chat turn cannot do."""


class TemplateFailure(ChatError):
    """The model's chat template could not render the conversation."""


@dataclass(frozen=True)
class Notice:
    """Something the session tells the user during a reply, e.g. that old turns were dropped."""

    text: str


@dataclass
class ReplyRecord:
    user: str
    text: str
    stats: ReplyStats
    stop_reason: str
    tokens: list[Token] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)  # each step's first refused draft (/why)

    @property
    def cut(self) -> bool:
        """The reply stopped before its end of turn: Ctrl-C, the /max cap or a full context window."""
        return self.stop_reason in CUT_MARKS

    @property
    def cut_mark(self) -> str:
        return CUT_MARKS.get(self.stop_reason, "")


@dataclass
class SessionTotals(ReplyStats):
    """Every reply so far summed; the rates are ReplyStats' own formulas over the sums."""

    replies: int = 0

    def add(self, stats: ReplyStats) -> None:
        self.replies += 1
        for name in ("new_tokens", "drafted", "accepted", "target_forwards", "wall_s"):
            setattr(self, name, getattr(self, name) + getattr(stats, name))


class ChatSession:
    def __init__(
        self,
        engine,
        tokenizer,
        config: Config,
        model_context_limit: int,
        compare_fn: CompareFn | None = None,
        stop_strings: tuple[str, ...] = (),
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.model_context_limit = model_context_limit
        self.compare_fn = compare_fn
        self.stop_strings = tuple(stop_strings)  # text that ends a reply (the plain template's "\nUser:")
        self._hinted: set[str] = set()  # drafters whose low acceptance the chat has pointed out
        self.messages: list[dict[str, str]] = []  # user/assistant turns; the system prompt is separate
        self.records: list[ReplyRecord] = []
        self.totals = SessionTotals()
        self.last_prompt_ids: list[int] = []
        self._context_used = 0
        self.saved_replies = 0  # records written by the last /save (the Ctrl-D offer asks only about newer ones)

    # ----- settings and state ----------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        return self.config.ui.system_prompt

    @property
    def context_limit(self) -> int:
        """Tokens the prompt plus the reply may use: the model's window, or less if configured."""
        wanted = self.config.ui.context_limit
        return min(wanted, self.model_context_limit) if wanted else self.model_context_limit

    @property
    def context_used(self) -> int:
        """Tokens of the conversation so far (prompt and reply of the last recorded turn). A message cancelled
        while its prompt was read is not part of it, though the engine holds its ids until the next reply."""
        return self._context_used

    @property
    def last_stats(self) -> ReplyStats | None:
        return self.records[-1].stats if self.records else None

    def reset(self) -> None:
        """Forget the conversation (the session totals stay)."""
        self.messages.clear()
        self.records.clear()
        self.last_prompt_ids = []
        self._context_used = 0
        self.saved_replies = 0
        self.engine.reset()

    def drop_caches(self) -> None:
        """Forget every cached token but keep the conversation: the next reply reads its whole prompt
        again. After a failure part-way through a reply, the caches may not match the ids they claim."""
        self.engine.reset()

    # ----- prompt ----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of system prompt + messages + the assistant's generation prompt."""
        return render_prompt(self.tokenizer, self.system_prompt, messages)

    @property
    def reply_room(self) -> int:
        """Tokens reserved for a reply: the /max cap, or with no cap REPLY_RESERVE (a quarter of a smaller window)."""
        cap = self.config.sampling.max_new_tokens
        return cap if cap else min(REPLY_RESERVE, self.context_limit // 4)

    def sampling_for(self, prompt_ids: list[int]) -> SamplingConfig:
        """The sampling settings a reply to `prompt_ids` runs with: with no cap, as many new tokens as the
        context window has left after the prompt (the engine always takes a number)."""
        sampling = self.config.sampling
        if sampling.capped:
            return sampling
        return dataclasses.replace(sampling, max_new_tokens=max(1, self.context_limit - len(prompt_ids)))

    def fit_prompt(self, messages: list[dict[str, str]]) -> tuple[list[int], int]:
        """Render, dropping the oldest user/assistant pairs until the reply fits; (ids, turns dropped)."""
        budget = self.context_limit - self.reply_room
        ids = self.render(messages)
        dropped = 0
        if len(ids) > budget and len(messages) > 1:  # the fewest pairs dropped that fit: a search, not one by one
            low, high = 1, (len(messages) - 1) // 2  # the newest message always stays
            while low < high:
                middle = (low + high) // 2
                if len(self.render(messages[2 * middle :])) <= budget:
                    high = middle
                else:
                    low = middle + 1
            dropped = low
            ids = self.render(messages[2 * dropped :])
        if len(ids) > budget:
            cap = self.config.sampling.max_new_tokens
            room = (
                f"max {cap} new tokens); shorten it or lower sampling.max_new_tokens (/max)"
                if cap
                else f"{self.reply_room} tokens kept for the reply); shorten it"
            )
            raise ChatError(
                f"the message needs {len(ids)} prompt tokens but only {max(budget, 0)} fit "
                f"(context {self.context_limit} minus {room}"
            )
        return ids, dropped

    # ----- a turn ----------------------------------------------------------------------------
    @property
    def has_drafter(self) -> bool:
        return self.engine.has_model_drafter

    def check_mode(self) -> None:
        speculation = self.config.speculation
        problem = drafter_needed(self.has_drafter, speculation.mode, drafter=speculation.drafter)
        if problem:
            hint = "/drafter lookup or /mode target" if speculation.mode == Mode.SPEC else "/mode target"
            raise ChatError(f"{problem}, and none is loaded; use {hint}")
        unusable = self.engine.drafter_problem(speculation.drafter) if speculation.mode == Mode.SPEC else None
        if unusable:
            raise ChatError(f"{unusable}; choose another with /drafter")

    def undo(self) -> tuple[ReplyRecord, list[dict[str, str]]]:
        """Drop the last exchange (the message and its reply); returns them. The session totals stay."""
        if not self.records or len(self.messages) < 2 or self.messages[-1]["role"] != "assistant":
            raise ChatError("no exchange to drop yet")
        record, pair = self.records.pop(), self.messages[-2:]
        del self.messages[-2:]
        self._context_used = len(self.render(self.messages)) if self.messages else 0
        self.saved_replies = min(self.saved_replies, len(self.records))
        return record, pair

    def retry(self, cancel: threading.Event | None = None) -> Iterator[Any]:
        """Answer the last message again with the current settings (a fresh seed when sampling with a fixed one).
        The old exchange comes back if the new reply ends before it began (Ctrl-C, an error)."""
        record, pair = self.undo()
        recorded = len(self.records)
        try:
            yield from self.reply(record.user, cancel, fresh_seed=not self.config.sampling.is_greedy)
        finally:
            if len(self.records) == recorded:
                self.records.append(record)
                self.messages.extend(pair)
                self._context_used = len(self.render(self.messages))

    def user_messages(self) -> list[str]:
        """The conversation's user messages still in the context, in order (/edit N numbers them from 1)."""
        return [m["content"] for m in self.messages if m["role"] == "user"]

    def edit(self, number: int, text: str, cancel: threading.Event | None = None) -> Iterator[Any]:
        """Answer `text` in place of user message `number` (1: the first still in the context): the exchanges from
        that message on are dropped, and come back if the new reply ends before it began (Ctrl-C, an error)."""
        starts = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if not 1 <= number <= len(starts):
            raise ChatError(f"no message {number}: the conversation has {len(starts)} (see /history)")
        later = self.messages[starts[number - 1] :]
        replies = sum(1 for m in later if m["role"] == "assistant")
        kept_records = self.records[len(self.records) - replies :] if replies else []
        del self.messages[starts[number - 1] :]
        del self.records[len(self.records) - len(kept_records) :]
        self._context_used = len(self.render(self.messages)) if self.messages else 0
        self.saved_replies = min(self.saved_replies, len(self.records))
        recorded = len(self.records)
        try:
            yield from self.reply(text, cancel)
        finally:
            if len(self.records) == recorded:  # no new reply: the conversation as it was
                self.messages.extend(later)
                self.records.extend(kept_records)
                self._context_used = len(self.render(self.messages))

    def restore(self, messages: list[dict[str, str]], records: list[ReplyRecord]) -> None:
        """Replace the conversation (/load): the caches start empty, so the next reply reads it all."""
        self.reset()
        self.messages, self.records = list(messages), list(records)
        self._context_used = len(self.render(self.messages)) if self.messages else 0
        self.saved_replies = len(records)

    def reply(self, text: str, cancel: threading.Event | None = None, fresh_seed: bool = False) -> Iterator[Any]:
        """Stream one reply to `text`: Notice, then the engine's events, then any compare output. `fresh_seed`:
        draw a new seed even where the setting fixes one (/retry)."""
        self.check_mode()
        bad = undecodable_at(text)
        if bad is not None:
            raise ChatError(
                f"the message has a byte that is not UTF-8 at character {bad + 1} (the terminal could "
                f"not decode it); nothing was sent"
            )
        cancel = cancel or threading.Event()
        wanted = self.messages + [{"role": "user", "content": text}]
        prompt_ids, dropped = self.fit_prompt(wanted)
        if dropped:
            del self.messages[: 2 * dropped]
            yield Notice(f"context full: dropped the oldest {_turns(dropped)} to fit {self.context_limit} tokens")
        self.last_prompt_ids = prompt_ids
        done, tokens, rejections = None, [], []
        for event in self._generate(prompt_ids, cancel, fresh_seed):
            if isinstance(event, Token):
                tokens.append(event)
            elif isinstance(event, Rejected) and event.detail is not None:
                rejections.append(event.detail)
            elif isinstance(event, ReplyDone):
                done = event
            yield event
        if done.stop_reason == "cancelled" and not done.ids:
            yield Notice("cancelled before the reply began: the message was not added to the conversation")
            return
        self._record(text, done, tokens, rejections)
        hint = self._drafter_hint(done.stats)
        if hint:
            yield Notice(hint)
        if self.compare_fn and self.config.speculation.compare != "off" and done.stop_reason != "cancelled":
            yield from self.compare_fn(self, prompt_ids, done, cancel)

    def _drafter_hint(self, stats: ReplyStats) -> str:
        """Once a chat per drafter: a hint when the drafter model (or self:N) drafted much and had almost nothing
        accepted, so that it slows the reply. Copies are left out: a missed copy costs next to nothing."""
        name = stats.drafter
        if stats.model_steps < HINT_STEPS or stats.acceptance_rate >= HINT_ACCEPTANCE or name in self._hinted:
            return ""
        self._hinted.add(name)
        return (
            f"the drafter {name} had {stats.acceptance_rate:.0%} of {stats.drafted} drafts accepted: drafting costs more "
            f"than it saves here; /compare drafters races the others, /drafter switches"
        )

    def _generate(self, prompt_ids: list[int], cancel: threading.Event, fresh_seed: bool = False) -> Iterator[Any]:
        """The engine's events for one reply through the reply loop the server shares (reply_loop.py)."""
        sampling = self.sampling_for(prompt_ids)
        sampling = dataclasses.replace(sampling, seed=RANDOM) if fresh_seed else sampling
        stops = self.stop_strings + self.config.sampling.stop
        for event in reply_events(self.engine, prompt_ids, sampling, self.config.speculation, stops, cancel):
            yield self._context_full(event)

    def _context_full(self, event: Any) -> Any:
        """With no /max cap, the engine's token limit is the context window: say so in the stop reason."""
        if isinstance(event, ReplyDone) and event.stop_reason == "max_tokens" and not self.config.sampling.capped:
            return dataclasses.replace(event, stop_reason=CONTEXT_FULL)
        return event

    def _record(self, user: str, done: ReplyDone, tokens: list[Token], rejections: list[Rejection]) -> None:
        self.messages.append({"role": "user", "content": user})
        self.messages.append({"role": "assistant", "content": done.text})
        self.records.append(ReplyRecord(user, done.text, done.stats, done.stop_reason, tokens, rejections))
        self._context_used = len(self.last_prompt_ids) + len(done.ids)
        self.totals.add(done.stats)


def _turns(n: int) -> str:
    return "turn" if n == 1 else f"{n} turns"
