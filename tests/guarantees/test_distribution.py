"""Statistical exactness: sampled speculative output follows the target's own distribution.

The exact joint distribution of the first two (or three) tokens is enumerated from the model's logits
(after temperature, top-k and top-p) with the hand-written `reference_probs`. Over N seeded runs, each
cell's empirical frequency must lie within z standard errors of its probability (z = 4.5 with a
Bonferroni-sized family, so a correct engine fails with probability < 1e-3), and no token outside the
support may appear. Every case runs at three sizes: QUICK_RUNS replies unmarked (the fast default,
`pytest -m "not slow"`), FAST_RUNS and RUNS under the `slow` marker (so `pytest` runs all three).
Negative controls plant one bug each and assert that the same check fails: at the size each was
written for, and (the two bugs QUICK_RUNS can see) at QUICK_RUNS too, so the fast default's checks
are shown to have teeth. QUICK_RUNS is mostly a support check (a token outside the support, as those
two bugs produce) and a check on gross errors of the law; a verifier without residual resampling is
caught only at RUNS (test_sampling.py checks the residual in the fast default).

The tiny models run on one thread here: on two threads shared with anything else, each forward
costs ten times as much.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from conftest import CheapDrafterGamma, make_engine, prompt_ids, reference_probs

import specchat.speculative.conversation
import specchat.speculative.reply
import specchat.speculative.step
from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.speculative.events import ReplyEnd
from specchat.speculative.sampling import sample
from specchat.speculative.step import StepResult
from specchat.speculative.verify import Verdict

SAMPLING = SamplingConfig(temperature=0.8, top_k=6, top_p=0.9, max_new_tokens=2)
RUNS = 3000
FAST_RUNS = 600
QUICK_RUNS = 100  # the fast default's size
SIZES = [QUICK_RUNS, pytest.param(FAST_RUNS, marks=pytest.mark.slow), pytest.param(RUNS, marks=pytest.mark.slow)]
Z = 4.5


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: the tiny models on one thread


@torch.inference_mode()
def exact_joint(model, ids, sampling, n) -> dict[tuple[int, ...], float]:
    """The law of the first n tokens, enumerated: every prefix in the support, times its next-token law."""
    joint = {(): 1.0}
    for _ in range(n):
        grown = {}
        for prefix, p_prefix in joint.items():
            law = reference_probs(model(torch.tensor([ids + list(prefix)])).logits[0, -1], sampling)
            for token, p in law.items():
                grown[prefix + (token,)] = p_prefix * p
        joint = grown
    return joint


def exact_first_two(target, ids, sampling) -> dict[tuple[int, int], float]:
    return exact_joint(target, ids, sampling, 2)


def engine_replies(engine, ids, gamma=0, drafter_vocab=0, drafter="model", sampling=SAMPLING, **speculation):
    """reply(seed, n) -> (ids, stats, steps) of one seeded reply of n tokens from the engine."""
    speculation = SpeculationConfig(gamma=gamma, drafter_vocab=drafter_vocab, drafter=drafter, **speculation)

    def reply(seed, n):
        params = SamplingConfig(**{**sampling.__dict__, "seed": seed, "max_new_tokens": n})
        items = list(engine.steps(ids, params, speculation))
        end = items[-1]
        assert isinstance(end, ReplyEnd)
        return end.ids, end.stats, [s for s in items if isinstance(s, StepResult)]

    return reply


def sampled(reply, runs, length, k=2, observe=None) -> Counter:
    """The first k tokens of `runs` seeded replies of `length` tokens; observe(stats, steps) sees each."""
    counts = Counter()
    for seed in range(runs):
        ids, stats, steps = reply(seed, length)
        assert len(ids) == length
        counts[tuple(ids[:k])] += 1
        if observe:
            observe(stats, steps)
    return counts


def empirical_first_two(reply, gamma, runs=RUNS) -> Counter:
    """The first two tokens of seeded replies of gamma + 1 tokens, so that the first step really
    drafts gamma tokens (a 2-token reply caps the draft at 1): rejections at every draft position, and
    second tokens that follow a rollback, are all counted."""
    drafted_at = Counter()
    counts = sampled(
        reply,
        runs,
        max(2, gamma + 1),
        observe=lambda stats, _: drafted_at.update(dict(enumerate(stats.per_position_drafted, 1))),
    )
    assert max(drafted_at) == gamma and drafted_at[gamma] >= runs // 2  # the drafts ran to gamma
    return counts


def worst_deviation(joint, counts) -> float:
    """Largest |freq - p| in units of the allowed bound; > 1 fails. Cells outside the support count as inf."""
    if set(counts) - set(joint):
        return math.inf
    runs = sum(counts.values())
    worst = 0.0
    for cell, p in joint.items():
        bound = Z * math.sqrt(p * (1 - p) / runs) + 1.0 / runs
        worst = max(worst, abs(counts.get(cell, 0) / runs - p) / bound)
    return worst


def check(joint, counts, name) -> float:
    """The worst deviation, printed (pytest -s shows each case's margin)."""
    worst = worst_deviation(joint, counts)
    print(f"\n{name}: {len(joint)} cells, {sum(counts.values())} runs, worst deviation {worst:.3f}")
    return worst


def broken_verify_sampled(drafts, q, p, generator):
    """Wrong on purpose: after a rejection it samples from p instead of norm(max(0, p - q))."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma)
    u = torch.rand(gamma, generator=generator)
    rejected = (u * q[rows, drafts] > p[rows, drafts]).tolist()
    accepted = rejected.index(True) if True in rejected else gamma
    return Verdict(accepted, int(sample(p[accepted : accepted + 1], generator)))


@pytest.fixture(scope="module")
def setting(target, similar_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, "The quick brown")
    return ids, exact_first_two(target, ids, SAMPLING)


@pytest.mark.parametrize("runs", SIZES)
@pytest.mark.parametrize(
    "gamma,drafter_vocab,drafter",
    [
        (1, 0, "similar_drafter_model"),
        (3, 0, "similar_drafter_model"),
        (2, 300, "similar_drafter_model"),
        (2, 300, "int8_drafter_model"),
    ],
)
def test_sampled_speculative_matches_target_distribution(
    setting, target, tokenizer, gamma, drafter_vocab, drafter, runs, request
):
    ids, joint = setting
    assert 4 <= len(joint) <= 36  # top-k/top-p really cut the support
    engine = make_engine(target, request.getfixturevalue(drafter), tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, gamma, drafter_vocab), gamma, runs)
    assert check(joint, counts, f"gamma {gamma} vocab {drafter_vocab} {drafter}") <= 1.0


# A subtle bug: RUNS replies catch it, FAST_RUNS do not (worst deviation 0.81; 200 runs 0.87), so it is
# slow with the RUNS cases it vouches for. The fast default checks the residual in test_sampling.py.
@pytest.mark.slow
def test_the_check_catches_a_verifier_without_residual_resampling(
    setting, target, similar_drafter_model, tokenizer, monkeypatch
):
    ids, joint = setting
    monkeypatch.setattr(specchat.speculative.step, "verify_sampled", broken_verify_sampled)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 1), 1, RUNS)
    assert check(joint, counts, "mutant: no residual resample") > 1.0


MIN_P = SamplingConfig(temperature=1.0, min_p=0.08, max_new_tokens=2)


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_min_p_matches_the_target_distribution(target, similar_drafter_model, tokenizer, runs):
    """min_p cuts p and q alike (sampling.py): the law of the first two tokens is the target's under min_p."""
    ids = prompt_ids(tokenizer, "The quick brown")
    joint = exact_first_two(target, ids, MIN_P)
    assert 4 <= len(joint) < len(exact_first_two(target, ids, dataclasses.replace(MIN_P, min_p=0.0)))  # it cuts
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 3, sampling=MIN_P), 3, runs)
    assert check(joint, counts, "min_p 0.08, gamma 3") <= 1.0


def nan_drafter(similar_drafter_model):
    """A drafter whose every logit is NaN (its head's weights are): its q is NaN, its drafts whatever sampling a NaN
    row gives (sampling.py: the last id)."""
    import copy

    drafter = copy.deepcopy(similar_drafter_model)
    with torch.no_grad():
        drafter.lm_head.weight.fill_(float("nan"))
    return drafter


def verify_sampled_passing_nan(drafts, q, p, generator):
    """Wrong on purpose, as verify.py was: refuse where u * q > p, a comparison NaN never makes, so a NaN drafter's
    every draft passes."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma)
    u = torch.rand(gamma, generator=generator)
    refused = (u * q[rows, drafts] > p[rows, drafts]).tolist()
    accepted = refused.index(True) if True in refused else gamma
    return Verdict(accepted, int(sample(p[min(accepted, gamma) : min(accepted, gamma) + 1], generator)))


@pytest.mark.parametrize("runs", SIZES)
def test_a_nan_drafter_changes_nothing_of_the_target_distribution(
    setting, target, similar_drafter_model, tokenizer, runs
):
    ids, joint = setting
    engine = make_engine(target, nan_drafter(similar_drafter_model), tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 3), 3, runs)
    assert check(joint, counts, "a NaN drafter, gamma 3") <= 1.0


def test_the_check_catches_a_rule_that_passes_a_nan_drafters_drafts(
    setting, target, similar_drafter_model, tokenizer, monkeypatch
):
    ids, joint = setting
    monkeypatch.setattr(specchat.speculative.step, "verify_sampled", verify_sampled_passing_nan)
    engine = make_engine(target, nan_drafter(similar_drafter_model), tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 3), 3, QUICK_RUNS)
    assert check(joint, counts, "mutant: NaN drafts pass") > 1.0


@pytest.fixture(scope="module")
def w8a8_pair(target, similar_drafter_model):
    import copy

    from specchat.quant.w8a8 import quantize_w8a8
    from specchat.runtime.attention import use_batch_invariant_attention

    pair = []
    for model in (target, similar_drafter_model):
        quantized = copy.deepcopy(model)
        quantize_w8a8(quantized)
        use_batch_invariant_attention(quantized)
        pair.append(quantized)
    return pair


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculative_with_a_w8a8_pair_matches_the_w8a8_targets_distribution(w8a8_pair, tokenizer, runs):
    target, drafter = w8a8_pair
    ids = prompt_ids(tokenizer, "The quick brown")
    joint = exact_first_two(target, ids, SAMPLING)
    assert 4 <= len(joint) <= 36
    counts = empirical_first_two(engine_replies(make_engine(target, drafter, tokenizer), ids, 2), 2, runs)
    assert check(joint, counts, "w8a8 pair, gamma 2") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_output_of_the_public_function_matches_the_target_distribution(
    setting, target, similar_drafter_model, runs
):
    import specchat

    ids, joint = setting

    def reply(seed, n):
        result = specchat.speculative_generate(
            ids,
            similar_drafter_model,
            target,
            gamma=3,
            seed=seed,
            temperature=SAMPLING.temperature,
            top_k=SAMPLING.top_k,
            top_p=SAMPLING.top_p,
            max_new_tokens=n,
            eos_token_ids=[],
        )
        return result.ids, result.stats, []

    assert check(joint, empirical_first_two(reply, 3, runs), "speculative_generate, gamma 3") <= 1.0


def lookup_prompt(target, tokenizer) -> list[int]:
    """A prompt whose newest three tokens occurred earlier, followed by two tokens a, b that the target
    itself finds likely there (found by a few rounds of fixed-point search), so that the lookup
    drafter's one-hot drafts are accepted often and rejected often."""
    start, filler = prompt_ids(tokenizer, "def reverse(items):"), prompt_ids(tokenizer, " so")
    a = b = 0
    for _ in range(8):
        seq = start + [a, b] + filler + start[-3:]
        law_a = exact_law(target, seq)
        a = max(law_a, key=law_a.get)
        law_b = exact_law(target, seq + [a])
        b = max(law_b, key=law_b.get)
    seq = start + [a, b] + filler + start[-3:]
    assert 0.1 < exact_law(target, seq).get(a, 0) < 0.9 and 0.1 < exact_law(target, seq + [a]).get(b, 0) < 0.9
    return seq


@torch.inference_mode()
def exact_law(target, ids):
    return reference_probs(target(torch.tensor([ids])).logits[0, -1], SAMPLING)


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_the_lookup_drafter_matches_target_distribution(target, tokenizer, runs):
    """The lookup drafter's q is one-hot: a copy is accepted with probability p(x), and a rejection
    resamples p without x. Two drafts per step, both in the target's support."""
    ids = lookup_prompt(target, tokenizer)
    joint = exact_first_two(target, ids, SAMPLING)
    engine = make_engine(target, None, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 2, drafter="lookup"), 2, runs)
    assert check(joint, counts, "lookup drafter, gamma 2") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_a_draft_head_matches_target_distribution(
    head_on_target, setting, target, tokenizer, runs
):
    """The head drafts from the target's own hidden states (drafters/head.py), 3 tokens a step from its own law;
    the first two tokens keep the target's."""
    ids, _ = setting
    engine = make_engine(target, None, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 3, drafter="head"), 3, runs)
    assert check(exact_first_two(target, ids, SAMPLING), counts, f"draft head, gamma 3, {runs} runs") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_the_auto_drafter_matches_target_distribution(
    target, similar_drafter_model, tokenizer, runs
):
    """drafter auto: a copy (one-hot q) where the newest 3 tokens occurred before, the model's draft (its
    own q) elsewhere, both within one reply; the first two tokens keep the target's law."""
    ids = lookup_prompt(target, tokenizer)
    joint = exact_first_two(target, ids, SAMPLING)
    sources = Counter()

    def observe(stats, steps):
        sources.update("copy" if s.draft.copied else "model" for s in steps if s.draft and len(s.draft.tokens))

    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 3, drafter="auto"), runs, 4, observe=observe)
    assert sources["copy"] >= runs // 10 and sources["model"] >= runs // 10
    assert check(joint, counts, "auto drafter, gamma 3") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_the_self_drafter_matches_target_distribution(setting, target, tokenizer, runs):
    """The target's first two layers draft (self:2): q is their own law, p the whole target's."""
    ids, joint = setting
    engine = make_engine(target, None, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 2, drafter="self:2"), 2, runs)
    assert check(joint, counts, "self:2 drafter, gamma 2") <= 1.0


THREE = SamplingConfig(temperature=0.8, top_k=3, top_p=1.0)  # 27 cells for three tokens


@pytest.mark.parametrize("runs", SIZES)
def test_the_joint_of_three_tokens_at_gamma_1(setting, target, similar_drafter_model, tokenizer, runs):
    """Three-token replies at gamma 1: the second and third tokens come from steps that follow an
    accepted draft (bonus), a rejection (rollback) or both, so the law of every token after a rollback
    is checked, not only the first two."""
    ids, _ = setting
    joint = exact_joint(target, ids, THREE, 3)
    assert 8 <= len(joint) <= 27
    seen = Counter()

    def observe(stats, steps):
        seen["rejections"] += stats.rejections
        seen["drafting steps after a rejection"] += any(s.drafted for s in steps[1:]) and bool(steps[0].rejected)

    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 1, sampling=THREE), runs, 3, k=3, observe=observe)
    assert seen["drafting steps after a rejection"] >= runs // 10
    assert check(joint, counts, "three tokens, gamma 1") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_auto_gamma_with_a_cheap_drafter_matches_target_distribution(
    setting, target, similar_drafter_model, tokenizer, runs
):
    """Auto gamma that takes the drafter to be cheap really drafts, several tokens a step, and its drafts
    end by the path floor (the policy learns across the runs, as it does across a chat's replies)."""
    ids, joint = setting
    engine = make_engine(target, similar_drafter_model, tokenizer, policy=CheapDrafterGamma())
    seen = Counter()

    def observe(stats, steps):
        seen["drafted"] += stats.drafted
        seen["rejections"] += stats.rejections
        seen["long drafts"] += sum(s.drafted >= 2 for s in steps)

    counts = sampled(engine_replies(engine, ids, AUTO), runs, 6, observe=observe)
    assert seen["drafted"] > 0 and seen["rejections"] > 0 and seen["long drafts"] >= runs // 4
    assert check(joint, counts, "auto gamma, cheap drafter") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_draft_confidence_matches_target_distribution(setting, target, similar_drafter_model, tokenizer, runs):
    """gamma 3 with draft_confidence 0.25: a draft ends after a token the drafter gives less than 0.25,
    so first steps draft 1, 2 or 3 tokens."""
    ids, joint = setting
    lengths = Counter()
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = sampled(
        engine_replies(engine, ids, 3, draft_confidence=0.25),
        runs,
        4,
        observe=lambda stats, steps: lengths.update([steps[0].drafted]),
    )
    assert set(lengths) == {1, 2, 3} and min(lengths.values()) >= runs // 20
    assert check(joint, counts, "draft_confidence 0.25, gamma 3") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_prompt_lookup_on_the_model_drafter_matches_target_distribution(target, similar_drafter_model, tokenizer, runs):
    """prompt_lookup on the model drafter, with a prompt that repeats: the drafter feeds the guessed
    continuation with its current token and drafts from the guess's rows while they match."""
    ids = lookup_prompt(target, tokenizer)
    joint = exact_first_two(target, ids, SAMPLING)
    guessed = Counter()

    def observe(stats, steps):  # a draft of more tokens than drafter forwards used a guess's row
        guessed["steps"] += sum(len(s.draft.tokens) > len(s.draft.forwards) for s in steps if s.draft)

    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 3, prompt_lookup=True), runs, 4, observe=observe)
    assert guessed["steps"] >= runs // 10
    assert check(joint, counts, "model drafter with prompt lookup, gamma 3") <= 1.0


FIRST_SEED = 12345


def follow_up_replies(engine, first, second_text, tokenizer, gamma=3):
    """reply(seed, n): the first prompt answered with FIRST_SEED (4 tokens), then on the same engine a
    second prompt that extends that conversation, answered with `seed`; returns the second reply. Each
    run's first prompt is a prefix of the previous run's conversation, so the engine crops its caches
    back to it; each second prompt reuses the first turn's caches and reads only its new tokens."""
    first_reply = engine_replies(engine, first, gamma)
    second = {}

    def reply(seed, n):
        ids, stats, _ = first_reply(FIRST_SEED, 4)
        assert stats.drafted and (seed == 0 or stats.reused_tokens >= len(first) - 1)
        if not second:
            second["prompt"] = first + list(ids) + prompt_ids(tokenizer, second_text)
            second["reply"] = engine_replies(engine, second["prompt"], gamma)
        assert first + list(ids) == second["prompt"][: len(first) + 4]  # the same first reply every run
        out = second["reply"](seed, n)
        assert out[1].reused_tokens >= len(first) + 3 and out[1].prefill_tokens >= 2
        return out

    return reply, second


@pytest.mark.parametrize("runs", SIZES)
def test_a_follow_up_turn_that_reuses_the_caches_matches_target_distribution(
    setting, target, similar_drafter_model, tokenizer, runs
):
    ids, _ = setting
    engine = make_engine(target, similar_drafter_model, tokenizer)
    reply, second = follow_up_replies(engine, ids, " over the lazy", tokenizer)
    counts = empirical_first_two(reply, 3, runs)
    joint = exact_first_two(target, second["prompt"], SAMPLING)
    assert check(joint, counts, "follow-up turn, gamma 3") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_target_only_mode_follows_the_target(setting, target, similar_drafter_model, tokenizer, runs):
    ids, joint = setting
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 3, mode="target"), runs, 2)
    assert check(joint, counts, "target-only mode") <= 1.0


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_drafter_only_mode_follows_the_drafter(setting, target, unrelated_drafter_model, tokenizer, runs):
    """Drafter-only mode's law is the drafter's own (top-k and top-p applied to its logits), not the target's."""
    ids, target_joint = setting
    joint = exact_first_two(unrelated_drafter_model, ids, SAMPLING)
    assert 4 <= len(joint) <= 36 and set(joint) != set(target_joint)
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 3, mode="drafter"), runs, 2)
    assert check(joint, counts, "drafter-only mode") <= 1.0


def forward_numbering_from_zero(model, cache, new_ids, keep):
    """Wrong on purpose: feeds new_ids at positions 0, 1, ... whatever the cache already holds (a
    prompt read after a reused prefix gets the positions of the conversation's start)."""
    from specchat.runtime import lean

    if isinstance(cache, lean.LeanKVCache):
        raise NotImplementedError("the mutant is written for transformers' cache")
    positions = torch.arange(len(new_ids)).unsqueeze(0)
    out = model(
        input_ids=torch.tensor([new_ids]),
        position_ids=positions,
        past_key_values=cache.inner,
        use_cache=True,
        logits_to_keep=keep,
    )
    return out.logits[0, -keep:]


def prompt_read_at_the_wrong_positions(setting, target, similar_drafter_model, tokenizer, monkeypatch, runs):
    """Only a follow-up turn reads a prompt after a reused cache: a single-turn reply reads from
    position 0, where the mutant is right, so the other cases cannot see it."""
    import types

    from specchat.speculative import model_io

    ids, _ = setting
    mutant = types.SimpleNamespace(**{**vars(model_io), "forward": forward_numbering_from_zero})
    monkeypatch.setattr(specchat.speculative.conversation, "model_io", mutant)  # the prompt's reading only
    engine = make_engine(target, similar_drafter_model, tokenizer)
    reply, second = follow_up_replies(engine, ids, " over the lazy", tokenizer)
    counts = empirical_first_two(reply, 3, runs)
    return check(
        exact_first_two(target, second["prompt"], SAMPLING), counts, f"mutant: prompt at position 0, {runs} runs"
    )


@pytest.mark.slow
def test_the_follow_up_check_catches_a_prompt_read_at_the_wrong_positions(
    setting, target, similar_drafter_model, tokenizer, monkeypatch
):
    assert (
        prompt_read_at_the_wrong_positions(setting, target, similar_drafter_model, tokenizer, monkeypatch, FAST_RUNS)
        > 1.0
    )


def test_the_quick_follow_up_check_catches_a_prompt_read_at_the_wrong_positions(
    setting, target, similar_drafter_model, tokenizer, monkeypatch
):
    assert (
        prompt_read_at_the_wrong_positions(setting, target, similar_drafter_model, tokenizer, monkeypatch, QUICK_RUNS)
        > 1.0
    )


def drafter_ignoring_the_sampling_settings(
    setting, target, unrelated_drafter_model, tokenizer, monkeypatch, runs
) -> float:
    """Drafter-only replies drawn from the drafter's plain softmax (temperature 1, no top-k or top-p)."""
    ids, _ = setting
    real_drafter_step = specchat.speculative.reply.drafter_step

    def plain_drafter_step(drafter, committed, sampling, generator):
        return real_drafter_step(drafter, committed, SamplingConfig(temperature=1.0, seed=sampling.seed), generator)

    monkeypatch.setattr(specchat.speculative.reply, "drafter_step", plain_drafter_step)
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    counts = sampled(engine_replies(engine, ids, 3, mode="drafter"), runs, 2)
    return check(exact_first_two(unrelated_drafter_model, ids, SAMPLING), counts, f"mutant: plain drafter, {runs} runs")


def test_the_drafter_only_check_catches_a_drafter_that_ignores_the_sampling_settings(
    setting, target, unrelated_drafter_model, tokenizer, monkeypatch
):
    assert (
        drafter_ignoring_the_sampling_settings(
            setting, target, unrelated_drafter_model, tokenizer, monkeypatch, FAST_RUNS
        )
        > 1.0
    )


def test_the_quick_drafter_only_check_catches_a_drafter_that_ignores_the_sampling_settings(
    setting, target, unrelated_drafter_model, tokenizer, monkeypatch
):
    assert (
        drafter_ignoring_the_sampling_settings(
            setting, target, unrelated_drafter_model, tokenizer, monkeypatch, QUICK_RUNS
        )
        > 1.0
    )


PENALTIES = SamplingConfig(temperature=1.0, top_k=8, max_new_tokens=2, repeat_penalty=3.0, presence_penalty=1.5)


@torch.inference_mode()
def exact_penalized_first_two(model, ids, sampling) -> dict[tuple[int, ...], float]:
    """The law of the first two tokens with llama.cpp's penalties written out by hand: each logit of an id among the
    last 64 before the token divided by repeat_penalty where positive, else multiplied, less presence_penalty."""
    joint = {(): 1.0}
    for _ in range(2):
        grown = {}
        for prefix, p_prefix in joint.items():
            context = ids + list(prefix)
            logits = model(torch.tensor([context])).logits[0, -1].double().tolist()
            for token in set(context[-64:]):
                value = logits[token]
                shrunk = value / sampling.repeat_penalty if value > 0 else value * sampling.repeat_penalty
                logits[token] = shrunk - sampling.presence_penalty
            for token, p in reference_probs(torch.tensor(logits), sampling).items():
                grown[prefix + (token,)] = p_prefix * p
        joint = grown
    return joint


@pytest.mark.parametrize("runs", SIZES)
def test_sampled_speculation_with_penalties_matches_the_penalized_target_distribution(
    target, similar_drafter_model, tokenizer, runs
):
    """repeat_penalty and presence_penalty reshape the target's law, each row for the ids before its own token: the
    first two tokens follow the penalized target's law, whatever the drafter (which drafts from its own)."""
    ids = prompt_ids(tokenizer, "def add(a, b): return a + b\ndef add(a, b):")
    joint = exact_penalized_first_two(target, ids, PENALTIES)
    plain = exact_first_two(target, ids, dataclasses.replace(PENALTIES, repeat_penalty=1.0, presence_penalty=0.0))
    assert max(abs(joint.get(cell, 0.0) - p) for cell, p in plain.items()) > 0.05  # the penalties bite
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 3, sampling=PENALTIES), 3, runs)
    assert check(joint, counts, "penalties, gamma 3") <= 1.0
