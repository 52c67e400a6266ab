"""The drafter's view of a long conversation (speculation.drafter_context): the middle left out of its
cache, the reply still exactly the target's, and the gap kept right across rollbacks and later turns."""

from __future__ import annotations

import pytest
import torch
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids

from specchat.config import ConfigError, SpeculationConfig
from specchat.settings import load_config, set_from_text
from specchat.speculative.drafters.context import MIN_GAP, ContextGap
from specchat.speculative.events import ReplyDone

LIMIT = 256


def long_prompt(tokenizer) -> list[int]:
    """A conversation of several hundred tokens: a pasted function many times, then a question."""
    text = "def area(width, height):\n    return width * height\n\n" * 40 + "Rename width to w:"
    ids = prompt_ids(tokenizer, text)
    assert len(ids) > LIMIT + MIN_GAP
    return ids


def test_a_conversation_longer_than_the_limit_keeps_its_first_quarter_and_its_newest_tokens():
    gap = ContextGap()
    gap.open(limit=LIMIT, total=1000, seen=0)
    assert (gap.start, gap.count) == (64, 1000 - LIMIT)
    assert gap.seen(cached=10) == 10 and gap.seen(cached=64) == 64 + gap.count  # counted once reached
    gap.open(limit=LIMIT, total=5000, seen=300)
    assert (gap.start, gap.count) == (64, 1000 - LIMIT)  # one gap at most


def test_short_conversations_and_small_gaps_are_read_whole():
    for limit, total, seen in [(0, 5000, 0), (LIMIT, LIMIT, 0), (LIMIT, LIMIT + MIN_GAP - 1, 0), (LIMIT, 1000, 900)]:
        gap = ContextGap()
        gap.open(limit, total, seen)
        assert gap.count == 0, (limit, total, seen)


def test_a_gap_starts_no_earlier_than_what_the_cache_already_holds():
    gap = ContextGap()
    gap.open(limit=LIMIT, total=1000, seen=200)  # an earlier turn's 200 tokens stay
    assert (gap.start, gap.count) == (200, 1000 - 192 - 200)


def test_a_cut_past_the_gap_keeps_it_and_a_cut_before_its_end_closes_it():
    gap = ContextGap(start=64, count=500)
    assert gap.cut(keep=700) == 200 and gap.count == 500
    assert gap.cut(keep=500) == 64 and gap.count == 0  # inside the gap: back to its start, gap closed
    gap = ContextGap(start=64, count=500)
    assert gap.cut(keep=30) == 30 and gap.count == 0


def replies(engine, ids, context: int, turns: int = 1) -> list[ReplyDone]:
    speculation = SpeculationConfig(gamma=4, drafter_context=context)
    out = []
    for _ in range(turns):
        out.append(list(engine.stream(ids, GREEDY, speculation))[-1])
        ids = ids + list(out[-1].ids) + ids[:20]  # a later turn repeats the start: its tail is new
    return out


def test_a_drafter_seeing_part_of_a_long_prompt_leaves_the_reply_exactly_the_targets(
    target, similar_drafter_model, tokenizer
):
    ids = long_prompt(tokenizer)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = replies(engine, ids, LIMIT)[0]
    assert list(done.ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)
    assert done.stats.drafted > 0
    drafter, conversation = engine.drafter, ids + list(done.ids)
    assert drafter.gap.count > 0 and drafter.cached < drafter.seen < len(conversation)  # the middle was left out
    start, end = drafter.gap.start, drafter.gap.start + drafter.gap.count
    viewed = conversation[:start] + conversation[end : drafter.seen + 1]  # what the cache holds, and the next token
    with torch.inference_mode():
        expected = similar_drafter_model(torch.tensor([viewed])).logits[0, -1]
        step = drafter._next_logits(torch.tensor([conversation[drafter.seen : drafter.seen + 1]]), None, keep=1)[0]
    assert torch.allclose(step, expected[: step.shape[0]], atol=1e-4)  # the cache is exactly the gapped view


def test_later_turns_over_a_gapped_cache_stay_exact_target_mode_keeps_it_and_drafter_mode_sees_everything(
    target, similar_drafter_model, tokenizer
):
    ids = long_prompt(tokenizer)
    gapped = replies(make_engine(target, similar_drafter_model, tokenizer), ids, LIMIT, turns=3)
    whole = replies(make_engine(target, similar_drafter_model, tokenizer), ids, 0, turns=3)
    assert [list(d.ids) for d in gapped] == [list(d.ids) for d in whole]
    engine = make_engine(target, similar_drafter_model, tokenizer)
    replies(engine, ids, LIMIT)
    list(engine.stream(ids, GREEDY, SpeculationConfig(mode="target", drafter_context=LIMIT)))  # compare mode's rerun
    assert engine.drafter.gap.count > 0 and engine.drafter.seen == len(ids) - 1  # rewound to the prompt, not reset
    list(engine.stream(ids, GREEDY, SpeculationConfig(mode="drafter", drafter_context=LIMIT)))
    assert engine.drafter.gap.count == 0 and engine.drafter.cached == engine.drafter.seen  # read again, whole


def test_the_bundled_config_limits_the_drafters_view_and_bad_values_say_what_is_allowed():
    assert load_config(None, []).speculation.drafter_context == 512
    with pytest.raises(ConfigError, match="at least 256"):
        set_from_text(load_config(None, []), "speculation.drafter_context", "100")
    assert set_from_text(load_config(None, []), "speculation.drafter_context", "0").speculation.drafter_context == 0


def test_a_second_long_paste_has_the_drafter_read_the_chats_start_and_end_anew(
    target, similar_drafter_model, tokenizer
):
    ids = long_prompt(tokenizer)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    first = replies(engine, ids, LIMIT)[0]
    conversation = ids + list(first.ids) + long_prompt(tokenizer)  # another paste, longer than the limit
    speculation = SpeculationConfig(gamma=4, drafter_context=LIMIT)
    second = list(engine.stream(conversation, GREEDY, speculation))[-1]
    assert list(second.ids) == hf_greedy(target, conversation, GREEDY.max_new_tokens)
    drafter = engine.drafter
    assert drafter.gap.start == LIMIT // 4 and drafter.cached <= LIMIT + GREEDY.max_new_tokens  # not both pastes
