"""Copies are planned apart from the drafter model: their length comes from how far copies of this chat were
accepted and what the target's extra rows cost, and a copy is offered whatever auto gamma says of the model,
unless the copies' record says it yields less than the model's draft (or a target-only step)."""

from __future__ import annotations

import pytest
import torch
from conftest import FixedCostGamma, hf_greedy, make_engine, prompt_ids

from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.speculative.copy_length import MAX_COPY, CopyRecord
from specchat.speculative.drafters.base import Draft
from specchat.speculative.drafters.lookup import match_start
from specchat.speculative.engine import run_to_end
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.step import StepResult

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=48)


def test_copies_taken_whole_plan_longer_copies_than_copies_refused_early():
    whole, broken = CopyRecord(), CopyRecord()
    for _ in range(20):
        whole.observe(16, 16)
        broken.observe(16, 2)
    assert whole.best_length(0.05) > 16 > broken.best_length(0.05)
    assert broken.survival(4)[2] < 0.2 < whole.survival(16)[-1]


def test_dearer_rows_plan_shorter_copies():
    record = CopyRecord()
    lengths = [record.best_length(r) for r in (0.02, 0.1, 0.3, 1.0)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert 1 <= lengths[-1] and lengths[0] <= MAX_COPY


def test_a_copy_past_its_end_says_nothing_of_the_positions_after_it():
    record = CopyRecord()
    record.observe(4, 4)
    assert record.judged[:5] == [1.0, 1.0, 1.0, 1.0, 0.0] and sum(record.refused) == 0
    record.observe(4, 1)  # the second token refused: judged at positions 1 and 2, refused at 2
    assert record.refused[1] == 1.0 and record.judged[2] < 1.0


class CostlyDrafterGamma(FixedCostGamma):
    """Auto gamma that takes the drafter model to cost 1.5 target steps: it never pays."""

    cost = 1.5


def test_auto_gamma_plans_copies_while_the_model_drafter_does_not_pay():
    policy = CostlyDrafterGamma()
    assert policy.best_gamma() == 0
    plans = [policy.plan() for _ in range(8)]
    assert all(plan.copy >= 4 for plan in plans) and [plan.gamma for plan in plans].count(0) == 7
    copy = Draft(torch.tensor([1, 2, 3, 4]), None, [], [1.0] * 4, source="lookup")
    before = policy.alpha
    policy.observe_step(StepResult([1, 2, 3, 4, 5], [], drafted=4, accepted=4, draft=copy))
    assert policy.copies.copies == 1 and policy.alpha == before


def refused_copies(policy: AutoGamma, copies: int = 30) -> AutoGamma:
    """The policy after `copies` copies of 4 tokens whose first token the target refused."""
    copy = Draft(torch.tensor([1, 2, 3, 4]), None, [], [1.0] * 4, source="lookup")
    for _ in range(copies):
        policy.observe_step(StepResult([9], [], drafted=4, accepted=0, draft=copy))
    return policy


def test_copies_that_yield_less_than_the_model_s_drafts_give_way_to_them_but_for_a_probe():
    """A copy replaces the model's draft for its step: copies refused at once (fresh writing's chance matches) lose
    to a drafter model that pays, and the model drafts; one step in probe_every still copies, to keep the record."""
    pays = refused_copies(FixedCostGamma())
    assert pays.best_gamma() > 0
    plans = [pays.plan() for _ in range(3 * pays.probe_every)]
    assert [plan.copy > 0 for plan in plans].count(True) == 3 and all(plan.gamma > 0 for plan in plans)
    assert pays.copy_length(0) == 0  # even against a target-only step such copies do not pay ...
    held = CostlyDrafterGamma()
    assert held.copy_length(0) >= 4  # ... where untried copies do, the model drafting or not
    whole = FixedCostGamma()
    copy = Draft(torch.tensor(list(range(8))), None, [], [1.0] * 8, source="lookup")
    for _ in range(10):
        whole.observe_step(StepResult(list(range(9)), [], drafted=8, accepted=8, draft=copy))
    assert all(whole.plan().copy > 8 for _ in range(3 * whole.probe_every))  # copies taken whole beat the model


def test_a_drafter_that_copies_alone_weighs_its_copies_against_target_only_steps():
    """No drafter model: the plan is a copy or nothing, whatever the model's (untimed, prior) speedup would be."""
    policy = AutoGamma()
    plan = policy.plan(model=False)
    assert plan.gamma == 0 and plan.copy == policy.copies.best_length(policy.row_cost)
    policy.copies = CopyRecord()
    for accepted in [0, 1] * 10:
        policy.copies.observe(4, accepted)  # the first token taken half the time: more than a target-only step's
    assert policy.plan(model=False).copy >= 1 and policy.copy_length(policy.best_gamma()) == 0


PASTE = (
    "Rename total to amount:\ndef add(total, x):\n    total = total + x\n\ndef add(total, x):\n    total = total + x\n"
)


def test_with_a_drafter_that_does_not_pay_no_target_only_step_is_taken_where_a_copy_matches(
    target, similar_drafter_model, tokenizer
):
    """The held-back pattern: auto gamma turns the model off, and the free copy must not go with it. The paste
    ends as it began, so the first step has a match (the tiny random target seldom copies after that)."""
    ids = prompt_ids(tokenizer, PASTE)
    engine = make_engine(target, similar_drafter_model, tokenizer, policy=CostlyDrafterGamma())
    speculation = SpeculationConfig(gamma=AUTO, drafter="auto")
    seen, held_back, steps = list(ids), 0, []
    for item in engine.steps(ids, GREEDY, speculation):
        if isinstance(item, StepResult):
            held_back += 1 if not item.drafted and match_start(seen) is not None else 0
            seen += item.tokens
            steps.append(item)
    assert seen[len(ids) :] == hf_greedy(target, ids, 48)
    assert match_start(ids) is not None and steps[0].draft is not None and steps[0].draft.copied
    assert steps[0].drafted >= 4 and held_back == 0


@pytest.mark.parametrize("drafter", ["auto", "lookup"])
def test_with_no_drafter_model_a_copy_is_weighed_against_a_target_only_step(target, tokenizer, drafter):
    """auto with no drafter model copies alone, as lookup does: a copy that yields more than one token a step is
    drafted, though a model's draft (which no model would write) is expected to yield more."""

    class HalfTakenCopies(FixedCostGamma):
        def __post_init__(self):
            super().__post_init__()
            for accepted in [0, 1] * 10:
                self.copies.observe(4, accepted)

    policy = HalfTakenCopies()
    assert policy.copy_length(policy.best_gamma()) == 0 < policy.copy_length(0)
    policy._copy_idle_steps = 0
    engine = make_engine(target, None, tokenizer, policy=policy)
    ids = prompt_ids(tokenizer, PASTE)
    first = next(
        i
        for i in engine.steps(ids, GREEDY, SpeculationConfig(gamma=AUTO, drafter=drafter))
        if isinstance(i, StepResult)
    )
    assert first.draft is not None and first.draft.copied and first.drafted >= 1


def test_the_reply_says_how_its_steps_and_time_were_split(target, similar_drafter_model, tokenizer):
    engine = make_engine(target, similar_drafter_model, tokenizer, policy=CostlyDrafterGamma())
    end = run_to_end(engine.steps(prompt_ids(tokenizer, PASTE), GREEDY, SpeculationConfig(gamma=AUTO, drafter="auto")))
    s = end.stats
    assert s.copied_steps + s.model_steps + s.target_only_steps == s.target_forwards
    assert s.copied_steps >= 1 and s.target_only_steps >= 1
    split = s.prefill_s + s.copy_s + s.model_s + s.target_only_s
    assert 0 < split <= s.wall_s and split > 0.8 * s.wall_s


def test_long_copies_price_the_copies_rows_but_not_the_model_drafts():
    """T(n) is convex on a CPU: a copy's 33 rows cost more a row than a draft's 5, so the model's plan is fitted
    without them (measured: shared fits planned shorter model drafts on fresh prompts), the copies' with them."""
    policy = AutoGamma()
    model = Draft(torch.tensor([1, 2, 3, 4]), None, [], [0.9] * 4)
    copy = Draft(torch.tensor(list(range(32))), None, [], [1.0] * 32, source="lookup")
    for _ in range(6):
        policy.observe_step(StepResult([1], [], target_seconds=0.020, target_fed=1))
        policy.observe_step(
            StepResult([1, 2, 3, 4, 5], [], drafted=4, accepted=4, draft=model, target_seconds=0.024, target_fed=5)
        )
        policy.observe_step(
            StepResult(list(range(33)), [], drafted=32, accepted=32, draft=copy, target_seconds=0.110, target_fed=33)
        )
    one_row, per_row = policy.target_rows.fit()
    assert per_row == pytest.approx(0.001) and one_row == pytest.approx(0.020)
    assert policy.row_cost == pytest.approx(policy.copy_rows.fit()[1] / policy.copy_rows.fit()[0])
    assert policy.row_cost > 0.1
