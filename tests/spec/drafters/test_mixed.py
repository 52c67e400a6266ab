"""The mixed drafter (speculation.drafter = auto): a copy where the chat offers a match, the drafter
model elsewhere; exact either way, and auto gamma learns the model's alpha only from the model's drafts."""

from __future__ import annotations

import torch
from conftest import hf_greedy, make_engine, prompt_ids

from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.spec.drafters.base import Draft, DraftPlan
from specchat.spec.drafters.mixed import COPY_TOKENS, MAX_COPY, MixedDrafter
from specchat.spec.gamma import AutoGamma
from specchat.spec.step import StepResult

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=40)
PASTED = (
    "def area(width, height):\n    return width * height\n\n"
    "Rename width to w in this function:\ndef area(width, height):\n    return width * height\n"
)


class CountingDrafter:
    """A stand-in drafter model that records its calls and drafts one fixed token."""

    def __init__(self):
        self.proposals, self.seen = 0, 0

    def propose(self, ids, plan, sampling, generator) -> Draft:
        self.proposals += 1
        return Draft(torch.tensor([7]), None, [(1, 0.0)], [0.5])


def repeated(n: int) -> list[int]:
    block = list(range(100, 100 + n))
    return block + [5, 6] + block[:9]  # the newest 9 tokens occurred before, followed by block[9:]


def test_a_match_is_copied_without_the_model_and_marked_off_plan():
    model = CountingDrafter()
    mixed = MixedDrafter(model, vocab_size=512)
    draft = mixed.propose(repeated(40), DraftPlan(gamma=3), GREEDY, torch.Generator())
    assert draft.tokens.tolist() == list(range(109, 109 + COPY_TOKENS)) and not draft.by_plan
    assert model.proposals == 0


def test_a_copy_never_passes_the_reply_s_room():
    draft = MixedDrafter(CountingDrafter(), 512).propose(
        repeated(30), DraftPlan(gamma=3, room=2), GREEDY, torch.Generator()
    )
    assert draft.tokens.tolist() == [109, 110]  # COPY_TOKENS would be 4


def test_no_match_leaves_drafting_to_the_model():
    model = CountingDrafter()
    ids = [1, 2, 3, 4, 9, 1, 2, 8, 4]  # the newest tokens never occurred before as three in a row
    draft = MixedDrafter(model, 512).propose(ids, DraftPlan(gamma=3), GREEDY, torch.Generator())
    assert draft.tokens.tolist() == [7] and draft.by_plan and model.proposals == 1


def test_without_a_model_auto_drafts_copies_alone():
    ids = [1, 2, 3, 4, 9, 1, 2, 3, 4]
    mixed = MixedDrafter(None, 512)
    assert mixed.propose(ids, DraftPlan(gamma=2), GREEDY, torch.Generator()).tokens.tolist() == [9, 1, 2, 3]
    assert mixed.propose([1, 2, 3], DraftPlan(gamma=2), GREEDY, torch.Generator()).tokens.tolist() == []


def test_auto_gamma_learns_no_alpha_from_a_copy():
    policy = AutoGamma()
    before = policy.alpha
    copy = Draft(torch.tensor([1, 2, 3]), None, [], [1.0] * 3, by_plan=False)
    policy.observe_step(StepResult([1, 2, 9], [], [3], drafted=3, accepted=2, draft=copy))
    assert policy.alpha == before
    model_draft = Draft(torch.tensor([1, 2, 3]), None, [], [1.0] * 3)
    policy.observe_step(StepResult([1, 2, 9], [], [3], drafted=3, accepted=2, draft=model_draft))
    assert policy.alpha != before


def test_greedy_auto_drafting_on_a_pasted_edit_equals_the_target_alone(target, similar_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, PASTED)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=AUTO, drafter="auto")))[-1]
    assert list(done.ids) == hf_greedy(target, ids, 40)
    assert engine.drafter is engine.drafters["auto"]
    assert 1 <= done.stats.copied_steps < done.stats.draft_steps  # both sources drafted in this reply


def test_the_stats_line_counts_the_copied_steps(target, similar_drafter_model, tokenizer):
    from specchat.tui.render import stats_line

    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = list(engine.stream(prompt_ids(tokenizer, PASTED), GREEDY, SpeculationConfig(gamma=3, drafter="auto")))[-1]
    assert 1 <= done.stats.copied_steps <= done.stats.draft_steps
    assert f" · {done.stats.copied_steps}/{done.stats.draft_steps} steps copied" in stats_line(done.stats)
    done.stats.copied_steps = 0  # a reply with no copy says nothing of them
    assert "copied" not in stats_line(done.stats) and "drafter" not in stats_line(done.stats)


def test_each_drafted_token_says_which_source_drafted_it(target, similar_drafter_model, tokenizer):
    """What /why and /trace report: a copy's tokens come from lookup, the model's from the model."""
    from specchat.spec.events import Origin, Rejected, Token

    engine = make_engine(target, similar_drafter_model, tokenizer)
    events = list(engine.stream(prompt_ids(tokenizer, PASTED), GREEDY, SpeculationConfig(gamma=3, drafter="auto")))
    tokens = [e for e in events if isinstance(e, Token)]
    refused = [e.detail for e in events if isinstance(e, Rejected) and e.detail is not None]
    drafted = [t.source for t in tokens if t.origin == Origin.DRAFTED] + [r.source for r in refused]
    assert set(drafted) == {"model", "lookup"}, drafted
    assert {t.source for t in tokens if t.origin != Origin.DRAFTED} == {""}


def test_a_copy_taken_whole_doubles_the_next_one_and_one_refused_starts_again_at_four():
    mixed = MixedDrafter(CountingDrafter(), 512)
    block = list(range(100, 160))
    ids = block + [5, 6] + block[:3]  # the newest 3 tokens occurred before: copies continue block
    lengths = []
    for _ in range(3):  # each copy taken whole: 4, 8, 16
        copy = mixed.propose(ids, DraftPlan(gamma=3), GREEDY, torch.Generator()).tokens.tolist()
        lengths.append(len(copy))
        ids = ids + copy + [block[len(ids) - 62 + len(copy)]]  # the copy, then the target's bonus token
    copy = mixed.propose(ids, DraftPlan(gamma=3), GREEDY, torch.Generator()).tokens.tolist()
    lengths.append(len(copy))  # capped at MAX_COPY
    ids = ids + copy[:2] + [7, 8, 9] + block[:3]  # two of that copy taken, then a fresh match
    lengths.append(len(mixed.propose(ids, DraftPlan(gamma=3), GREEDY, torch.Generator()).tokens))
    assert lengths == [COPY_TOKENS, 8, MAX_COPY, MAX_COPY, COPY_TOKENS]
