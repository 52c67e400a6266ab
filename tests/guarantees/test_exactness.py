"""The engine's exactness: greedy speculative == greedy target-only == transformers generate()."""

from __future__ import annotations

import pytest
from conftest import GREEDY, CheapDrafterGamma, hf_greedy, make_engine, prompt_ids, run_reply

from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.speculative.events import Origin, Rejected, StepDone, Token
from specchat.speculative.step import StepResult

PROMPTS = ["def reverse(lst):", "The quick brown", "Hello, how are you"]


@pytest.fixture(scope="module")
def greedy_replies(target, tokenizer) -> dict[str, tuple[list[int], list[int]]]:
    """Per prompt: (transformers' greedy continuation, the engine's target-only reply). Neither depends
    on the drafter or gamma, so each is computed once for all the cases of its prompt below."""
    replies = {}
    for text in PROMPTS:
        ids = prompt_ids(tokenizer, text)
        _, target_only = run_reply(make_engine(target, None, tokenizer), ids, mode="target")
        replies[text] = hf_greedy(target, ids, GREEDY.max_new_tokens), list(target_only.ids)
    return replies


def greedy_cases() -> list:
    """Every drafter × prompt × gamma (36 cases). The fast default runs 12: each drafter at every gamma,
    the prompt turning with the gamma, so every pair of drafter, prompt and gamma meets; the rest are slow."""
    drafters = ["unrelated_drafter_model", "similar_drafter_model", "int8_drafter_model"]
    return [
        pytest.param(drafter, text, gamma, marks=() if (d + g) % len(PROMPTS) == p else pytest.mark.slow)
        for d, drafter in enumerate(drafters)
        for p, text in enumerate(PROMPTS)
        for g, gamma in enumerate([1, 2, 4, 8])
    ]


@pytest.mark.parametrize("drafter, text, gamma", greedy_cases())
def test_greedy_speculative_equals_target_only_and_transformers(
    target, drafter, tokenizer, gamma, text, greedy_replies, request
):
    reference, target_only = greedy_replies[text]
    engine = make_engine(target, request.getfixturevalue(drafter), tokenizer)
    _, spec = run_reply(engine, prompt_ids(tokenizer, text), gamma=gamma)
    assert target_only == reference
    assert list(spec.ids) == reference
    assert spec.stats.drafted > 0 and spec.stats.acceptance_rate < 0.95  # drafts do get rejected


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_drafter_equal_to_target_accepts_every_draft(target, tokenizer, gamma):
    ids = prompt_ids(tokenizer, PROMPTS[0])
    n = (gamma + 1) * 4
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=n)
    _, done = run_reply(make_engine(target, target, tokenizer), ids, sampling=sampling, gamma=gamma)
    assert list(done.ids) == hf_greedy(target, ids, n)
    assert done.stats.acceptance_rate == 1.0
    assert done.stats.tokens_per_step == gamma + 1
    assert done.stats.accepted_histogram == {gamma: 4}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_exact_for_other_seeds_and_auto_gamma(tokenizer, seed):
    """Auto gamma on other random pairs, with the drafter taken to be cheap so that auto really drafts
    (on the tiny models' measured costs it would draft nothing, and the test would check target-only)."""
    from tiny_models import build_model

    target = build_model(len(tokenizer), seed=10 + seed, layers=2)
    drafter = build_model(len(tokenizer), seed=20 + seed, layers=1, hidden=32)
    ids = prompt_ids(tokenizer, PROMPTS[seed])
    reference = hf_greedy(target, ids, GREEDY.max_new_tokens)
    engine = make_engine(target, drafter, tokenizer, policy=CheapDrafterGamma())
    _, auto = run_reply(engine, ids, gamma=AUTO)
    assert list(auto.ids) == reference
    assert auto.stats.drafted > 0 and auto.stats.rejections > 0  # drafts ran, and some were refused


@pytest.mark.parametrize("limit", [256, 300])
def test_a_drafter_restricted_to_low_ids_stays_exact(target, similar_drafter_model, tokenizer, limit):
    """The reply needs ids at or above the limit that the prompt lacks: the drafter cannot propose them
    before they are seen, so the target writes each the first time, and the reply is still exact."""
    ids = prompt_ids(tokenizer, PROMPTS[0])
    engine = make_engine(target, similar_drafter_model, tokenizer)
    speculation = SpeculationConfig(gamma=4, drafter_vocab=limit)
    prefix, drafted, first_high = list(ids), 0, {}
    for step in engine.steps(ids, GREEDY, speculation):
        if not isinstance(step, StepResult):
            continue
        proposed = step.draft.tokens.tolist() if step.draft else []
        assert set(proposed) <= set(range(limit)) | set(prefix)  # low ids, or ids seen before this step
        drafted += len(proposed)
        for token, origin in zip(step.tokens, step.origins):
            if token >= limit and token not in prefix:
                first_high.setdefault(token, origin)
            prefix.append(token)
    assert prefix[len(ids) :] == hf_greedy(target, ids, GREEDY.max_new_tokens)
    assert drafted and len(first_high) >= 5  # high ids the prompt lacks really appear in the reply
    assert Origin.DRAFTED not in first_high.values()  # each written by the target when first needed


def test_gamma_zero_equals_target_only(target, unrelated_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, PROMPTS[1])
    events, done = run_reply(make_engine(target, unrelated_drafter_model, tokenizer), ids, gamma=0)
    assert list(done.ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)
    assert done.stats.drafted == 0
    assert {e.origin for e in events if isinstance(e, Token)} == {Origin.TARGET}


def test_origins_and_rejections_are_reported(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    events, done = run_reply(engine, prompt_ids(tokenizer, PROMPTS[0]), gamma=4)
    tokens = [e for e in events if isinstance(e, Token)]
    steps = [e for e in events if isinstance(e, StepDone)]
    rejected = [e for e in events if isinstance(e, Rejected)]
    assert [t.id for t in tokens] == list(done.ids)
    assert sum(s.accepted for s in steps) == done.stats.accepted
    assert sum(t.origin == Origin.DRAFTED for t in tokens) == done.stats.accepted
    assert {t.origin for t in tokens} <= {Origin.DRAFTED, Origin.CORRECTED, Origin.BONUS, Origin.TARGET}
    # gamma shrinks to 0 only when one token is left to the limit: a plain target step
    assert [i for i, t in enumerate(tokens) if t.origin == Origin.TARGET] in ([], [len(tokens) - 1])
    assert rejected and all(0 < len(r.ids) <= 4 for r in rejected)
    # every step ends with exactly one token from the target
    from_target = (Origin.CORRECTED, Origin.BONUS, Origin.TARGET)
    assert sum(t.origin in from_target for t in tokens) == len(steps)


def test_drafter_only_mode_matches_drafter_greedy(target, unrelated_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, PROMPTS[2])
    events, done = run_reply(make_engine(target, unrelated_drafter_model, tokenizer), ids, mode="drafter")
    assert list(done.ids) == hf_greedy(unrelated_drafter_model, ids, GREEDY.max_new_tokens)
    assert {e.origin for e in events if isinstance(e, Token)} == {Origin.DRAFTER}


@pytest.mark.parametrize("drafter", ["target", "similar_drafter_model"])
def test_auto_gamma_ends_drafts_by_the_path_floor_and_stays_exact(target, tokenizer, drafter, request):
    ids = prompt_ids(tokenizer, PROMPTS[0])
    policy = CheapDrafterGamma()
    engine = make_engine(target, request.getfixturevalue(drafter), tokenizer, policy=policy)
    events = list(
        engine.stream(ids, SamplingConfig(temperature=0.0, max_new_tokens=120), SpeculationConfig(gamma=AUTO))
    )
    drafted = [s.drafted for s in events if isinstance(s, StepDone)]
    assert list(events[-1].ids) == hf_greedy(target, ids, 120)
    assert any(1 < d < policy.max_draft for d in drafted[:-2])  # ended by the floor, not the cap
    if drafter == "target":  # always right, less sure of itself than it should be: drafts grow long
        assert policy.calibration > 1 and max(drafted) > 4


def test_a_draft_may_end_early_when_the_drafter_doubts_itself(target, similar_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, PROMPTS[1])
    engine = make_engine(target, similar_drafter_model, tokenizer)
    events = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=8, draft_confidence=0.5)))
    steps = [e for e in events if isinstance(e, StepDone)]
    assert list(events[-1].ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)
    assert any(0 < s.drafted < 8 for s in steps[:-2])  # shortened by confidence, not by the token limit


PENALIZED = SamplingConfig(temperature=0.0, max_new_tokens=24, repeat_penalty=1.8)


@pytest.mark.parametrize("gamma", [2, 4])
def test_greedy_with_a_repeat_penalty_equals_transformers_and_target_only(
    target, similar_drafter_model, tokenizer, gamma
):
    """A repeat penalty reshapes every row of the target's logits for the ids before its own token (the drafts
    before it too): speculative == target-only == transformers' RepetitionPenaltyLogitsProcessor, which is the
    same rule over all the ids, equal here where prompt and reply stay within the 64-id window."""
    import torch

    ids = prompt_ids(tokenizer, "The quick brown")
    plain = run_reply(make_engine(target, None, tokenizer), ids, sampling=GREEDY, mode="target")[1]
    solo = run_reply(make_engine(target, None, tokenizer), ids, sampling=PENALIZED, mode="target")[1]
    spec = run_reply(make_engine(target, similar_drafter_model, tokenizer), ids, sampling=PENALIZED, gamma=gamma)[1]
    with torch.no_grad():
        out = target.generate(
            torch.tensor([ids]),
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            repetition_penalty=1.8,
            eos_token_id=None,
            pad_token_id=0,
        )
    reference = out[0, len(ids) :].tolist()
    assert len(ids) + 24 <= 64
    assert list(solo.ids) == reference and list(spec.ids) == reference
    assert list(plain.ids)[:24] != reference  # the penalty did change the reply
    assert spec.stats.drafted > 0 and spec.stats.acceptance_rate < 0.95


def test_greedy_with_both_penalties_stays_exact(target, similar_drafter_model, tokenizer):
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=40, repeat_penalty=1.3, presence_penalty=0.7)
    ids = prompt_ids(tokenizer, "def reverse(lst):")
    solo = run_reply(make_engine(target, None, tokenizer), ids, sampling=sampling, mode="target")[1]
    spec = run_reply(make_engine(target, similar_drafter_model, tokenizer), ids, sampling=sampling, gamma=4)[1]
    assert list(spec.ids) == list(solo.ids) and spec.stats.drafted > 0


def test_each_verified_row_is_penalized_for_the_drafts_before_it(target, similar_drafter_model, tokenizer, monkeypatch):
    """Row i of a verification follows the context and drafts 0..i-1: its penalty counts those drafts (a repeat
    of an accepted draft inside one step is penalized as target-only decoding would penalize it)."""
    import specchat.speculative.step as step_module

    calls = []
    real = step_module.penalize

    def spy(logits, contexts, params):
        calls.append([list(context) for context in contexts])
        return real(logits, contexts, params)

    monkeypatch.setattr(step_module, "penalize", spy)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=20, repeat_penalty=1.3)
    ids = prompt_ids(tokenizer, "The quick brown")
    run_reply(make_engine(target, similar_drafter_model, tokenizer), ids, sampling=sampling, gamma=4)
    assert any(len(contexts) > 1 for contexts in calls)
    for contexts in calls:
        first, last = contexts[0], contexts[-1]
        assert [len(context) - len(first) for context in contexts] == list(range(len(contexts)))
        assert all(context == last[: len(first) + row] for row, context in enumerate(contexts))
