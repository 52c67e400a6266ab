"""Multi-turn time to first token: turn 3 of a chat with KV reuse across turns, and without it."""

from __future__ import annotations

from dataclasses import dataclass

from specchat.config import Config
from specchat.session.chat import ChatSession
from specchat.settings import with_value
from specchat.speculative.engine import Engine
from specchat.speculative.events import ReplyDone

TURNS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Make it ignore case and punctuation.",
    "Now add a docstring and three doctest examples.",
)


@dataclass(frozen=True)
class TurnTiming:
    reuse: bool
    ttft_s: float  # time to first token of the last turn
    prompt_tokens: int  # of the last turn
    reused_tokens: int  # prompt tokens whose KV came from earlier turns


def last_turn_timing(pair, cfg: Config, reuse: bool, max_new: int) -> TurnTiming:
    cfg = with_value(with_value(cfg, "sampling.max_new_tokens", max_new), "sampling.temperature", 0.0)
    session = ChatSession(Engine.for_pair(pair), pair.tokenizer, cfg, pair.context_limit)
    done = None
    for text in TURNS:
        if not reuse:
            session.engine.reset()  # forget the caches: the whole conversation is encoded again
        done = [e for e in session.reply(text) if isinstance(e, ReplyDone)][0]
    s = done.stats
    return TurnTiming(reuse, s.ttft_s, s.prompt_tokens, s.reused_tokens)


def compare_reuse(pair, cfg: Config, max_new: int = 48) -> list[TurnTiming]:
    """The same 3-turn chat run once with KV reuse across turns, then once without it."""
    return [last_turn_timing(pair, cfg, True, max_new), last_turn_timing(pair, cfg, False, max_new)]
