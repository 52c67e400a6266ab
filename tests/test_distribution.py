"""Statistical exactness: sampled speculative output follows the target's own distribution.

The exact joint distribution of the first two tokens is enumerated from the target's logits
(after temperature, top-k and top-p). Over N seeded runs, each cell's empirical frequency must lie
within z standard errors of its probability (z = 4.5 with a Bonferroni-sized family, so a correct
engine fails with probability < 1e-3), and no token outside the support may appear.
A verifier without the residual resample must fail the same check.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import specchat.core.step
from conftest import make_engine, prompt_ids, reference_probs
from specchat.config import SamplingConfig, SpeculationConfig
from specchat.core.events import ReplyDone
from specchat.core.sampling import sample
from specchat.core.verify import Verdict

SAMPLING = SamplingConfig(temperature=0.8, top_k=6, top_p=0.9, max_new_tokens=2)
RUNS = 3000
Z = 4.5


@torch.inference_mode()
def exact_first_two(target, ids, sampling) -> dict[tuple[int, int], float]:
    def next_probs(seq):
        return reference_probs(target(torch.tensor([seq])).logits[0, -1], sampling)
    joint = {}
    for a, p_a in next_probs(ids).items():
        for b, p_b in next_probs(ids + [a]).items():
            joint[(a, b)] = p_a * p_b
    return joint


def engine_replies(engine, ids, gamma, drafter_vocab=0, drafter="model"):
    """reply(seed, n) -> (ids, stats) of one seeded reply of n tokens from the engine."""
    speculation = SpeculationConfig(gamma=gamma, drafter_vocab=drafter_vocab, drafter=drafter)

    def reply(seed, n):
        sampling = SamplingConfig(**{**SAMPLING.__dict__, "seed": seed, "max_new_tokens": n})
        done = [e for e in engine.stream(ids, sampling, speculation)][-1]
        assert isinstance(done, ReplyDone)
        return done.ids, done.stats
    return reply


def empirical_first_two(reply, gamma) -> Counter:
    """The first two tokens of RUNS seeded replies of gamma + 1 tokens, so that the first step really
    drafts gamma tokens (a 2-token reply caps the draft at 1): rejections at every draft position, and
    second tokens that follow a rollback, are all counted."""
    counts, drafted_at = Counter(), Counter()
    for seed in range(RUNS):
        ids, stats = reply(seed, max(2, gamma + 1))
        assert len(ids) == max(2, gamma + 1)
        counts[tuple(ids[:2])] += 1
        drafted_at.update(dict(enumerate(stats.per_position_drafted, start=1)))
    assert max(drafted_at) == gamma and drafted_at[gamma] >= RUNS // 2  # the drafts ran to gamma
    return counts


def worst_deviation(joint, counts) -> float:
    """Largest |freq - p| in units of the allowed bound; > 1 fails. Cells outside the support count as inf."""
    if set(counts) - set(joint):
        return math.inf
    worst = 0.0
    for cell, p in joint.items():
        bound = Z * math.sqrt(p * (1 - p) / RUNS) + 1.0 / RUNS
        worst = max(worst, abs(counts.get(cell, 0) / RUNS - p) / bound)
    return worst


def broken_verify_sampled(drafts, q, p, generator):
    """Wrong on purpose: after a rejection it samples from p instead of norm(max(0, p - q))."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma)
    u = torch.rand(gamma, generator=generator)
    rejected = (u * q[rows, drafts] > p[rows, drafts]).tolist()
    accepted = rejected.index(True) if True in rejected else gamma
    return Verdict(accepted, int(sample(p[accepted:accepted + 1], generator)))


@pytest.fixture(scope="module")
def setting(target, similar_drafter_model, tokenizer):
    ids = prompt_ids(tokenizer, "The quick brown")
    return ids, exact_first_two(target, ids, SAMPLING)


@pytest.mark.parametrize("gamma,drafter_vocab,drafter", [(1, 0, "similar_drafter_model"),
                                                         (3, 0, "similar_drafter_model"),
                                                         (2, 300, "similar_drafter_model"),
                                                         (2, 300, "int8_drafter_model")])
def test_sampled_speculative_matches_target_distribution(setting, target, tokenizer, gamma, drafter_vocab,
                                                         drafter, request):
    ids, joint = setting
    assert 4 <= len(joint) <= 36  # top-k/top-p really cut the support
    engine = make_engine(target, request.getfixturevalue(drafter), tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, gamma, drafter_vocab), gamma)
    assert worst_deviation(joint, counts) <= 1.0


def test_the_check_catches_a_verifier_without_residual_resampling(setting, target, similar_drafter_model,
                                                                  tokenizer, monkeypatch):
    ids, joint = setting
    monkeypatch.setattr(specchat.core.step, "verify_sampled", broken_verify_sampled)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 1), gamma=1)
    assert worst_deviation(joint, counts) > 1.0


@pytest.fixture(scope="module")
def w8a8_pair(target, similar_drafter_model):
    import copy
    from specchat.core.invariant_attention import use_batch_invariant_attention
    from specchat.core.w8a8 import quantize_w8a8
    pair = []
    for model in (target, similar_drafter_model):
        quantized = copy.deepcopy(model)
        quantize_w8a8(quantized)
        use_batch_invariant_attention(quantized)
        pair.append(quantized)
    return pair


def test_sampled_speculative_with_a_w8a8_pair_matches_the_w8a8_targets_distribution(w8a8_pair, tokenizer):
    target, drafter = w8a8_pair
    ids = prompt_ids(tokenizer, "The quick brown")
    joint = exact_first_two(target, ids, SAMPLING)
    assert 4 <= len(joint) <= 36
    counts = empirical_first_two(engine_replies(make_engine(target, drafter, tokenizer), ids, 2), gamma=2)
    assert worst_deviation(joint, counts) <= 1.0


def test_sampled_output_of_the_public_function_matches_the_target_distribution(setting, target,
                                                                               similar_drafter_model):
    import specchat
    ids, joint = setting

    def reply(seed, n):
        result = specchat.speculative_generate(ids, similar_drafter_model, target, gamma=3, seed=seed,
                                               temperature=SAMPLING.temperature, top_k=SAMPLING.top_k,
                                               top_p=SAMPLING.top_p, max_new_tokens=n, eos_token_ids=[])
        return result.ids, result.stats
    assert worst_deviation(joint, empirical_first_two(reply, gamma=3)) <= 1.0


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


def test_sampled_speculation_with_the_lookup_drafter_matches_target_distribution(target, tokenizer):
    """The lookup drafter's q is one-hot: a copy is accepted with probability p(x), and a rejection
    resamples p without x. Two drafts per step, both in the target's support."""
    ids = lookup_prompt(target, tokenizer)
    joint = exact_first_two(target, ids, SAMPLING)
    engine = make_engine(target, None, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 2, drafter="lookup"), gamma=2)
    assert worst_deviation(joint, counts) <= 1.0


def test_sampled_speculation_with_the_self_drafter_matches_target_distribution(setting, target, tokenizer):
    """The target's first two layers draft (self:2): q is their own law, p the whole target's."""
    ids, joint = setting
    engine = make_engine(target, None, tokenizer)
    counts = empirical_first_two(engine_replies(engine, ids, 2, drafter="self:2"), gamma=2)
    assert worst_deviation(joint, counts) <= 1.0
