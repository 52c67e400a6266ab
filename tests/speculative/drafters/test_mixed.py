"""The mixed drafter (speculation.drafter = auto): a copy where the chat offers a match, the drafter
model elsewhere; exact either way, and auto gamma learns the model's alpha only from the model's drafts."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy, make_engine, prompt_ids

from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.base import Draft, DraftPlan
from specchat.speculative.drafters.mixed import COPY_TOKENS, MixedDrafter
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.step import StepResult

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
    draft = mixed.propose(repeated(40), DraftPlan(gamma=3, copy=16), GREEDY, torch.Generator())
    assert draft.tokens.tolist() == list(range(109, 109 + COPY_TOKENS)) and draft.copied
    assert model.proposals == 0


def test_a_copy_never_passes_the_reply_s_room():
    draft = MixedDrafter(CountingDrafter(), 512).propose(
        repeated(30), DraftPlan(gamma=3, room=2, copy=16), GREEDY, torch.Generator()
    )
    assert draft.tokens.tolist() == [109, 110]  # COPY_TOKENS would be 4


def test_no_match_leaves_drafting_to_the_model():
    model = CountingDrafter()
    ids = [1, 2, 3, 4, 9, 1, 2, 8, 4]  # the newest tokens never occurred before as three in a row
    draft = MixedDrafter(model, 512).propose(ids, DraftPlan(gamma=3, copy=16), GREEDY, torch.Generator())
    assert draft.tokens.tolist() == [7] and not draft.copied and model.proposals == 1


def test_without_a_model_auto_drafts_copies_alone():
    ids = [1, 2, 3, 4, 9, 1, 2, 3, 4]
    mixed = MixedDrafter(None, 512)
    assert mixed.propose(ids, DraftPlan(gamma=2, copy=8), GREEDY, torch.Generator()).tokens.tolist() == [9, 1, 2, 3]
    assert mixed.propose([1, 2, 3], DraftPlan(gamma=2, copy=8), GREEDY, torch.Generator()).tokens.tolist() == []


def test_auto_gamma_learns_no_alpha_from_a_copy():
    policy = AutoGamma()
    before = policy.alpha
    copy = Draft(torch.tensor([1, 2, 3]), None, [], [1.0] * 3, source="lookup")
    policy.observe_step(StepResult([1, 2, 9], [], drafted=3, accepted=2, rejected=[3], draft=copy))
    assert policy.alpha == before
    model_draft = Draft(torch.tensor([1, 2, 3]), None, [], [1.0] * 3)
    policy.observe_step(StepResult([1, 2, 9], [], drafted=3, accepted=2, rejected=[3], draft=model_draft))
    assert policy.alpha != before


def test_greedy_auto_drafting_on_a_pasted_edit_equals_the_target_alone(target, similar_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, PASTED)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=AUTO, drafter="auto")))[-1]
    assert list(done.ids) == hf_greedy(target, ids, 40)
    assert engine.drafter is engine.drafters.built["auto"]
    assert 1 <= done.stats.copied_steps < done.stats.draft_steps  # both sources drafted in this reply


def test_the_stats_line_counts_the_copied_steps(target, similar_drafter_model, tokenizer):
    from specchat.tui.render import stats_line

    engine = make_engine(target, similar_drafter_model, tokenizer)
    done = list(engine.stream(prompt_ids(tokenizer, PASTED), GREEDY, SpeculationConfig(gamma=3, drafter="auto")))[-1]
    s = done.stats
    assert 1 <= s.copied_steps <= s.draft_steps == s.copied_steps + s.model_steps
    assert s.copied_steps + s.model_steps + s.target_only_steps == s.target_forwards
    split = f" · steps {s.copied_steps} copied, {s.model_steps} model, {s.target_only_steps} target-only"
    assert split in stats_line(s)
    s.copied_steps = 0  # a reply with no copy says nothing of them
    assert "copied" not in stats_line(s) and "drafter" not in stats_line(s)


def test_each_drafted_token_says_which_source_drafted_it(target, similar_drafter_model, tokenizer):
    """What /why and /trace report: a copy's tokens come from lookup, the model's from the model."""
    from specchat.speculative.events import Origin, Rejected, Token

    engine = make_engine(target, similar_drafter_model, tokenizer)
    events = list(engine.stream(prompt_ids(tokenizer, PASTED), GREEDY, SpeculationConfig(gamma=3, drafter="auto")))
    tokens = [e for e in events if isinstance(e, Token)]
    refused = [e.detail for e in events if isinstance(e, Rejected) and e.detail is not None]
    drafted = [t.source for t in tokens if t.origin == Origin.DRAFTED] + [r.source for r in refused]
    assert set(drafted) == {"model", "lookup"}, drafted
    assert {t.source for t in tokens if t.origin != Origin.DRAFTED} == {""}


def test_a_copy_taken_whole_doubles_the_next_one_and_one_refused_starts_again_at_four():
    mixed, plan = MixedDrafter(CountingDrafter(), 512), DraftPlan(gamma=3, copy=16)
    block = list(range(100, 160))
    ids = block + [5, 6] + block[:3]  # the newest 3 tokens occurred before: copies continue block
    lengths = []
    for _ in range(3):  # each copy taken whole: 4, 8, 16
        copy = mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens.tolist()
        lengths.append(len(copy))
        ids = ids + copy + [block[len(ids) - 62 + len(copy)]]  # the copy, then the target's bonus token
    copy = mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens.tolist()
    lengths.append(len(copy))  # capped at the plan's copy length
    ids = ids + copy[:2] + [7, 8, 9] + block[:3]  # two of that copy taken, then a fresh match
    lengths.append(len(mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens))
    assert lengths == [COPY_TOKENS, 8, 16, 16, COPY_TOKENS]


def test_a_copy_is_offered_when_the_model_drafts_nothing():
    """Auto gamma's verdict on the drafter model (gamma 0) holds back the model, never a copy."""
    model = CountingDrafter()
    mixed = MixedDrafter(model, 512)
    copy = mixed.propose(repeated(40), DraftPlan(gamma=0, copy=16), GREEDY, torch.Generator())
    assert copy.tokens.tolist() == list(range(109, 113)) and copy.copied
    short_match = [1, 2, 3, 4, 9, 1, 2, 8, 4]  # only the newest token occurred before: a 4-token guess after it
    assert mixed.propose(short_match, DraftPlan(gamma=0, copy=16), GREEDY, torch.Generator()).tokens.tolist() == [
        9,
        1,
        2,
        8,
    ]
    assert mixed.propose(short_match, DraftPlan(gamma=3, copy=16), GREEDY, torch.Generator()).tokens.tolist() == [7]
    no_match = [1, 2, 3, 4, 9, 1, 2, 8, 5]
    assert mixed.propose(no_match, DraftPlan(gamma=0, copy=16), GREEDY, torch.Generator()).tokens.tolist() == []
    assert model.proposals == 1


@pytest.mark.parametrize("edit", ["replaced", "left out"])
def test_a_copy_goes_on_past_a_one_token_edit_without_a_fresh_match(edit):
    """A rename: the target puts its own token where the source had another; where the model drafts nothing,
    the copy resumes after it (where the model drafts, the model does)."""
    mixed, plan = MixedDrafter(CountingDrafter(), 512), DraftPlan(gamma=0, copy=16)
    source = list(range(100, 140))
    ids = source + [5, 6] + source[:3]
    copy = mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens.tolist()
    assert copy == source[3:7]
    corrected = 99 if edit == "replaced" else source[6]  # the target refused source[5]
    ids = ids + copy[:2] + [corrected]  # newest 3: source[3], source[4], corrected: never seen in a row
    mixed.last_copy = (len(ids) - 3, copy, 3)
    model = mixed.drafter
    assert mixed.propose(ids, DraftPlan(gamma=3, copy=16), GREEDY, torch.Generator()).tokens.tolist() == [7]
    assert model.proposals == 1
    mixed.last_copy = (len(ids) - 3, copy, 3)
    resumed = mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens.tolist()
    assert resumed == (source[6:10] if edit == "replaced" else source[7:11])
    ids = ids + [42]  # that guess refused at once: no further resuming, and 42 never occurred before
    assert mixed.propose(ids, plan, GREEDY, torch.Generator()).tokens.tolist() == []
