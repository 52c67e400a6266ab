"""bench/edits.py: the edit replies' side-by-side run counts the target-only steps taken where a copy matched."""

from __future__ import annotations

import dataclasses

from conftest import make_engine, prompt_ids

from specchat.bench.edits import reply, reply_line
from specchat.config import AUTO, SpeculationConfig
from specchat.speculative.drafters.lookup import match_start

PASTE = (
    "Rename total to amount:\ndef add(total, x):\n    total = total + x\n\ndef add(total, x):\n    total = total + x\n"
)


def test_a_target_only_reply_is_held_back_where_a_copy_matched_and_speculation_is_not(
    target, similar_drafter_model, tokenizer
):
    ids = prompt_ids(tokenizer, PASTE)
    assert match_start(ids) is not None  # the first step could copy
    engine = make_engine(target, similar_drafter_model, tokenizer)
    alone = reply(engine, ids, SpeculationConfig(gamma=0, mode="target"), 24)
    fast = reply(engine, ids, SpeculationConfig(gamma=AUTO, drafter="auto"), 24)
    assert alone.held_back >= 1 and alone.longest_target_run == alone.stats.target_forwards
    assert fast.held_back == 0 and fast.ids == alone.ids
    line = reply_line("paste", alone, fast)
    assert line.startswith("paste: 24 tok · ") and "with a copy to be had" in line and "time: reading" in line
    assert dataclasses.asdict(fast.stats)["copied_steps"] >= 1
