"""A whole step's split (bench/step_split.py): time lands in the part that spent it, and the parts add up to
the step."""

from __future__ import annotations

import time

import pytest
from conftest import make_engine, prompt_ids

from specchat.bench import step_split
from specchat.speculative.conversation import Conversation


def test_a_slow_commit_lands_in_commit_and_the_parts_add_up_to_the_step(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    real_append = Conversation.append

    def slow_append(self, *args):
        time.sleep(0.02)
        real_append(self, *args)

    monkeypatch.setattr(Conversation, "append", slow_append)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    split, steps, per_step = step_split.split_steps(engine, prompt_ids(tokenizer, "def add(a, b):"), 4, 24)
    assert steps >= 1 and 1.0 <= per_step <= 5.0
    assert split["commit and roll back"] >= 20.0  # ms a step: the sleep's
    assert sum(split[part] for part in step_split.PARTS) == pytest.approx(split["step"])
    assert split["step"] > split["commit and roll back"]
    assert split["target forward"] > 0 and split["drafter forwards"] > 0 and split["drafter forwards a step"] >= 1
    table = step_split.split_table(split, steps, per_step)
    assert "| commit and roll back |" in table and "beyond the forwards" in table
    assert Conversation.append is slow_append  # every stopwatch taken off again
