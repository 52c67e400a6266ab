"""A reply stuck in a loop ends with the stop reason "repetition" (session/repetition.py); a reply that repeats a
word as asked, 50 times, is written whole."""

from __future__ import annotations

import pytest
from conftest import ScriptedEngine

from specchat.config import Config, SamplingConfig
from specchat.session.chat import CUT_MARKS, ChatSession
from specchat.session.repetition import REPETITION, repeated_span
from specchat.speculative.events import ReplyDone, Token
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.origin import Origin


def test_a_span_counts_once_it_has_run_64_tokens_and_8_times():
    prose = list(range(500))
    assert repeated_span(prose, 64) == 0
    assert repeated_span([1] * 63, 64) == 0 and repeated_span([1] * 64, 64) == 1
    assert repeated_span(prose + [7] * 50, 64) == 0  # a word asked for 50 times
    assert repeated_span(prose + [3, 4, 5] * 21, 64) == 0 and repeated_span(prose + [3, 4, 5] * 22, 64) == 3
    span = list(range(900, 916))
    assert repeated_span(prose + span * 7 + span[:15], 64) == 0 and repeated_span(prose + span * 8, 64) == 16
    assert repeated_span(prose + [5, 6] * 40 + [9], 64) == 0  # the loop was left


class LoopingEngine(ScriptedEngine):
    """Answers one token, 🙂, a step, until the cancel flag it is given is set (or `limit` tokens)."""

    def __init__(self, limit: int = 1000, word: int = 7):
        super().__init__([], with_drafter=True)
        self.limit, self.word, self.sent = limit, word, 0

    def stream(self, prompt_ids, sampling, speculation, cancel=None, constraint=None):
        while self.sent < self.limit and not (cancel and cancel.is_set()):
            self.sent += 1
            yield Token(self.word, "🙂", Origin.TARGET)
        reason = "cancelled" if cancel and cancel.is_set() else "eos"
        self.ids = list(prompt_ids) + [self.word] * self.sent
        yield ReplyDone(ReplyStats(new_tokens=self.sent), "🙂" * self.sent, (self.word,) * self.sent, reason)


def reply(session, text="Write a smiley.") -> ReplyDone:
    return [e for e in session.reply(text) if isinstance(e, ReplyDone)][-1]


@pytest.mark.parametrize(
    "setting, stopped_at, reason", [(64, 64, REPETITION), (0, 1000, "eos"), (200, 200, REPETITION)]
)
def test_a_looping_reply_stops_within_64_tokens_of_its_eighth_repeat(tokenizer, setting, stopped_at, reason):
    engine = LoopingEngine()
    cfg = Config(sampling=SamplingConfig(repetition_stop=setting))
    session = ChatSession(engine, tokenizer, cfg, 4096)
    done = reply(session)
    assert engine.sent == stopped_at and done.stop_reason == reason
    assert session.records[-1].cut == (reason == REPETITION)
    assert CUT_MARKS[REPETITION] == "✂ [cut: the reply was repeating itself]"


def test_a_word_asked_for_50_times_is_written_whole(tokenizer):
    engine = LoopingEngine(limit=50)
    done = reply(ChatSession(engine, tokenizer, Config(), 4096), "Say smiley 50 times.")
    assert engine.sent == 50 and done.stop_reason == "eos"


def test_a_drafter_whose_drafts_are_refused_gets_one_hint(tokenizer):
    """self:N on a model not trained for it accepts next to nothing: after such a reply the chat says so, once."""
    from specchat.session.chat import Notice

    def refused(**counts):
        stats = ReplyStats(drafter="self:4", **counts)
        return [ReplyDone(stats, "text", (7,), "eos")]

    engine = ScriptedEngine([refused(model_steps=20, drafted=60, accepted=1)] * 2 + [refused(model_steps=3)])
    session = ChatSession(engine, tokenizer, Config(), 4096)
    notices = [e.text for e in session.reply("one") if isinstance(e, Notice)]
    assert notices == [
        "the drafter self:4 had 2% of 60 drafts accepted: drafting costs more than it saves here; "
        "/compare drafters races the others, /drafter switches"
    ]
    assert not [e for e in session.reply("two") if isinstance(e, Notice)]  # said once
