"""What the engine tells the UI. The engine never prints; the UI never touches tensors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

from specchat.speculative.detok import Detokenizer
from specchat.speculative.insight import Rejection
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.origin import Origin
from specchat.speculative.step import Odds, StepResult


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the text delta this token adds; all deltas concatenated == tokenizer.decode(ids)
    origin: Origin
    step: int = -1  # the reply's step that produced it (0-based)
    position: int = 0  # its place in that step: drafts 0..n-1, then the target's token at n
    odds: Odds = Odds()
    source: str = ""  # what drafted it (drafted tokens): model | lookup | text


@dataclass(frozen=True)
class Rejected:
    ids: tuple[int, ...]  # drafts the target refused, in order
    text: str  # their decoded text, for a UI that shows them struck through
    detail: Rejection | None = None  # p, q and each model's top tokens at the first of them (/why)


@dataclass(frozen=True)
class StepDone:
    drafted: int
    accepted: int


@dataclass(frozen=True)
class PrefillProgress:
    """A chunk of a new prompt was read into the caches: `done` of `total` tokens, in `seconds` so far."""

    done: int
    total: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ReplyDone:
    stats: ReplyStats
    text: str  # the whole reply, tokenizer.decode(ids)
    ids: tuple[int, ...]
    stop_reason: str  # "eos" | "max_tokens" | "cancelled"; ChatSession adds "stop_string" (a reply it cut)
    seed: int = -1  # the sampling seed the reply really used (drawn when the setting is random)


@dataclass(frozen=True)
class ReplyEnd:
    """The end of Engine.steps(): like ReplyDone, without text (nothing is detokenized)."""

    stats: ReplyStats
    ids: tuple[int, ...]
    stop_reason: str
    seed: int


Event = Union[Token, Rejected, StepDone, PrefillProgress, ReplyDone]  # noqa: UP007 (evaluated at import)


def step_events(step: StepResult, detok: Detokenizer) -> Iterator[Event]:
    """A committed step as events: accepted drafts, the rejected ones, the target's token, each token with its
    Odds (step.py), then StepDone."""
    for i, (token, origin, odds) in enumerate(zip(step.tokens, step.origins, step.odds)):
        if i == step.accepted and step.rejected:
            yield Rejected(tuple(step.rejected), detok.decode(step.rejected), step.rejection)
        text = detok.push(token)
        if step.last and i == len(step.tokens) - 1:
            text += detok.flush()  # a tail held back for an incomplete character, now final
        source = step.draft.source if origin == Origin.DRAFTED and step.draft is not None else ""
        yield Token(token, text, origin, step.index, i, odds, source)
    yield StepDone(step.drafted, step.accepted)
