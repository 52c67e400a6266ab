"""Sampling transforms, the verifier's rules, the metrics and auto gamma."""

from __future__ import annotations

import pytest
import torch

from specchat.config import SamplingConfig
from specchat.speculative.drafters.base import DraftPlan
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.metrics import StatsRecorder, leviathan_speedup
from specchat.speculative.sampling import TORCH_SAMPLER, CompiledSampler, make_generator, sample
from specchat.speculative.verify import residual, verify_greedy, verify_sampled

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


@pytest.fixture(params=["torch", "compiled"])
def probs_fn(request):
    """The torch Sampler's probabilities, then a CompiledSampler's on the compiled module's (kernels/sampling.cpp),
    which a pair that runs on the module samples with; skipped where the module cannot be built."""
    if request.param == "torch":
        return TORCH_SAMPLER.probs
    return CompiledSampler(request.getfixturevalue("kernel").top_p_probs).probs


def test_greedy_is_one_hot_argmax(probs_fn):
    probs = probs_fn(LOGITS, SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[1.0, 0, 0, 0, 0, 0]]


def test_temperature_top_k_top_p_and_no_in_place_edit(probs_fn):
    before = LOGITS.clone()
    probs = probs_fn(LOGITS, SamplingConfig(temperature=0.5, top_k=4, top_p=0.9))[0]
    assert torch.equal(LOGITS, before)
    scaled = torch.softmax(LOGITS[0, :4] / 0.5, dim=-1)  # top-k keeps 4
    # top-p: keep the smallest prefix whose mass reaches 0.9
    keep = int((torch.cumsum(scaled, 0) - scaled < 0.9).sum())
    expected = torch.zeros(6)
    expected[:keep] = scaled[:keep] / scaled[:keep].sum()
    assert torch.allclose(probs, expected, atol=1e-6)
    assert keep < 4


def test_top_p_always_keeps_the_most_likely_token(probs_fn):
    probs = probs_fn(LOGITS, SamplingConfig(temperature=1.0, top_p=0.01))[0]
    assert probs[0] == 1.0 and probs[1:].sum() == 0


@pytest.mark.parametrize("temperature", [1e-320, 1e-40, 1e-38, 1e-30])  # logits / T was inf or nan (REPL fuzz)
def test_a_tiny_temperature_samples_the_most_likely_token(temperature, probs_fn):
    probs = probs_fn(LOGITS * 40, SamplingConfig(temperature=temperature, top_k=3, top_p=0.9))[0]
    assert probs[0] == 1.0 and probs[1:].sum() == 0


@pytest.mark.parametrize("top_p", [1e-320, 1e-46, 5e-324])  # 0 once compared in float32 (found by the REPL fuzz)
def test_a_top_p_too_small_for_float32_keeps_the_most_likely_token(top_p, probs_fn):
    probs = probs_fn(LOGITS, SamplingConfig(temperature=1.0, top_p=top_p))[0]
    assert probs[0] == 1.0 and probs[1:].sum() == 0


def nucleus_by_sorting(logits: torch.Tensor, top_p: float) -> list[set[int]]:
    """Reference: sort each row, keep tokens while the mass before them is below top_p."""
    sets = []
    for row in torch.softmax(logits.double(), dim=-1):
        order = sorted(range(row.shape[0]), key=lambda i: -float(row[i]))
        kept, mass = set(), 0.0
        for i in order:
            if mass >= top_p:
                break
            kept.add(i)
            mass += float(row[i])
        sets.append(kept)
    return sets


@pytest.mark.parametrize("spread", [8.0, 0.05])  # a peaked nucleus, and one wider than the first candidates
def test_top_p_keeps_the_nucleus_a_full_sort_finds(spread, monkeypatch, probs_fn):
    import specchat.speculative.sampling as sampling

    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 16)
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(2)) * spread
    probs = probs_fn(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    kept = [set(torch.nonzero(row).flatten().tolist()) for row in probs]
    assert kept == nucleus_by_sorting(logits, 0.8)
    assert spread > 1 or min(len(k) for k in kept) > 16  # the flat rows did need a wider search


def test_top_p_keeps_ties_with_the_last_token_kept(probs_fn):
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, -2.0]])
    probs = probs_fn(logits, SamplingConfig(temperature=1.0, top_p=0.75))[0]
    assert (probs[:4] > 0).all() and probs[4] == 0


def test_verify_greedy_accepts_the_matching_prefix():
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([3, 1, 4, 2]):
        logits[row, best] = 1.0
    assert verify_greedy(torch.tensor([3, 1, 0]), logits).__dict__ == {"accepted": 2, "next_token": 4}
    assert verify_greedy(torch.tensor([3, 1, 4]), logits).__dict__ == {"accepted": 3, "next_token": 2}
    assert verify_greedy(torch.tensor([0, 1, 4]), logits).__dict__ == {"accepted": 0, "next_token": 3}


def test_verify_sampled_accepts_when_p_covers_q_and_resamples_from_the_residual():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q_same = torch.tensor([[0.5, 0.5, 0.0]])
    verdict = verify_sampled(torch.tensor([1]), q_same, p, make_generator(0))
    assert verdict.accepted == 1 and verdict.next_token == 2  # bonus from p[1]
    q_elsewhere = torch.tensor([[0.0, 0.0, 1.0]])  # p(x)=0: always rejected
    for seed in range(20):
        verdict = verify_sampled(torch.tensor([2]), q_elsewhere, p, make_generator(seed))
        assert verdict.accepted == 0 and verdict.next_token in (0, 1)


def test_a_drafter_whose_q_is_nan_has_every_draft_refused_and_the_token_drawn_from_p():
    """Every comparison with NaN is false: written as `u * q > p` refuses, NaN passed every draft (sampled mode)."""
    p = torch.tensor([[0.25, 0.75, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    nan_q = torch.full((2, 3), float("nan"))
    for seed in range(20):
        verdict = verify_sampled(torch.tensor([1, 2]), nan_q, p, make_generator(seed))
        assert int(verdict.accepted) == 0 and int(verdict.next_token) in (0, 1)


def test_residual_is_normalised_positive_part():
    r = residual(torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.5, 0.3]))
    assert torch.allclose(r, torch.tensor([1.0, 0.0, 0.0]))
    same = torch.tensor([0.2, 0.8])
    assert torch.equal(residual(same, same), same)


def test_leviathan_bound():
    assert leviathan_speedup(0.0, 4, 0.0) == 1.0
    assert leviathan_speedup(1.0, 4, 0.0) == 5.0
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))


def test_recorder_counts_positions_and_histogram():
    rec = StatsRecorder("spec", 3, prompt_tokens=5, reused_tokens=0)
    rec.record_drafts(3, 1)
    rec.record_drafts(3, 3)
    rec.record_tokens(2 + 4)
    stats = rec.finish()
    assert stats.acceptance_rate == 4 / 6
    assert stats.per_position_rate == [1.0, 0.5, 0.5]
    assert stats.accepted_histogram == {1: 1, 3: 1}
    assert stats.mean_gamma == 3
    assert stats.alpha_per_draft == 4 / 5  # one rejection judged among five drafts


def test_auto_gamma_grows_with_acceptance_and_backs_off_to_zero():
    auto = AutoGamma()
    for _ in range(30):
        auto.observe_cost("drafter", 0.01)
        auto.observe_cost("target", 0.1)
        auto.observe(8, 8)
    high = auto.best_gamma()
    for _ in range(80):
        auto.observe(high, 0)
    assert high >= 6
    assert auto.plan().gamma == 0  # nothing pays: target-only steps...
    picks = [auto.plan().gamma for _ in range(auto.probe_every)]
    assert 1 in picks  # ...with an occasional probe so it can recover


def _settled(auto: AutoGamma, drafter_s: float, accepted_of_8: int) -> AutoGamma:
    for _ in range(40):
        auto.observe_cost("drafter", drafter_s)
        auto.observe_cost("target", 0.1)
        auto.observe(8, accepted_of_8)
    return auto


def test_auto_plan_drafts_long_and_ends_by_a_floor_that_rises_with_cost():
    cheap, costly = _settled(AutoGamma(), 0.01, 6), _settled(AutoGamma(), 0.03, 6)
    plan = cheap.plan()
    assert plan.gamma == cheap.max_draft and 0 < plan.path_floor < costly.plan().path_floor < 1


def test_the_confidence_scale_follows_how_often_confident_tokens_pass():
    overconfident, underconfident = AutoGamma(), AutoGamma()
    for _ in range(40):
        overconfident.observe_confidences([0.99] * 8, accepted=2)  # 3 judged, 2.97 said, 2 passed
        underconfident.observe_confidences([0.2] * 8, accepted=8)  # 8 judged, 1.6 said, 8 passed
    assert 0.6 < overconfident.calibration < 0.75
    assert underconfident.calibration > 4
    assert overconfident.plan().confidence_scale == overconfident.calibration


def test_probing_and_off_plans_have_no_floor():
    auto = AutoGamma()
    for _ in range(80):
        auto.observe(4, 0)
    plans = [auto.plan() for _ in range(auto.probe_every)]
    copy = auto.copy_length(0)  # copies are planned apart, off or not
    assert DraftPlan(0, 0.0, 1.0, copy=copy) in plans and DraftPlan(1, 0.0, 1.0, copy=copy) in plans


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [
        (0.7, 0, 1.0, 0.0),
        (1.0, 5, 1.0, 0.0),
        (0.8, 0, 0.9, 0.0),
        (1.3, 12, 0.75, 0.0),
        (0.5, 3, 0.5, 0.0),
        (2.0, 40, 0.95, 0.0),
        (1.0, 0, 1.0, 0.05),
        (0.8, 20, 0.95, 0.2),
    ],
)
def test_probs_from_logits_follow_the_written_definitions_ties_included(temperature, top_k, top_p, min_p, probs_fn):
    """Against helpers.reference_probs (plain Python from the definitions, not the code under test),
    on random logits, half of them rounded so that ties sit at the top-k and top-p cuts."""
    from conftest import reference_probs

    generator = torch.Generator().manual_seed(11)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    for row in range(40):
        logits = torch.randn(64, generator=generator) * 3
        if row % 2:
            logits = (logits * 2).round() / 2  # many exact ties
        expected = reference_probs(logits, sampling)
        got = probs_fn(logits[None], sampling)[0]
        assert set(torch.nonzero(got).flatten().tolist()) == set(expected)
        assert all(abs(float(got[i]) - p) < 1e-5 for i, p in expected.items())


def test_sample_draws_each_id_at_its_probability_and_never_a_zero_one():
    """Inverse-CDF draws: counts over 200k draws of a law with tiny, zero and large probabilities,
    zeros at both ends and inside, against a chi-square bound (df 5; 0.1% level: 20.5)."""
    probs = torch.tensor([0.0, 1e-3, 0.0, 0.25, 0.4989, 0.0, 0.2, 1e-4, 0.05, 0.0])
    generator = make_generator(7)
    draws = sample(probs.expand(200_000, -1), generator)
    counts = torch.bincount(draws, minlength=10).double()
    assert counts[probs == 0].sum() == 0
    expected = probs.double() / probs.sum() * 200_000
    kept = probs > 0
    assert ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum() < 20.5


def test_sample_at_the_top_of_the_unit_interval_still_avoids_zero_probability_ids(monkeypatch):
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.full(shape, 1.0 - 2**-53, dtype=torch.float64))
    assert sample(probs, make_generator(0)).tolist() == [1, 3]
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: torch.zeros(shape, dtype=torch.float64))
    assert sample(probs, make_generator(0)).tolist() == [0, 3]


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("row", ["+inf", "nan"])
@pytest.mark.parametrize("mode,gamma", [("spec", 4), ("target", 0)])
def test_a_target_whose_logits_are_not_finite_stops_the_reply_with_one_error(tokenizer, row, mode, gamma, temperature):
    """+inf or NaN logits give NaN probabilities (the torch code and the compiled one alike): the step refuses
    them once it reads its p back, instead of drawing some token; nothing is emitted from them. Greedy too: the
    argmax of a NaN row is no token (before, greedy gave an empty reply that said nothing)."""
    import copy

    from conftest import make_engine
    from tiny_models import build_model

    from specchat.config import SpeculationConfig
    from specchat.speculative.events import Token
    from specchat.speculative.sampling import NoLawError

    target = build_model(len(tokenizer), seed=1, layers=2)
    with torch.no_grad():
        target.lm_head.weight[7] = float("inf") if row == "+inf" else float("nan")
    engine = make_engine(target, copy.deepcopy(target), tokenizer)
    events = []
    with pytest.raises(NoLawError, match="not a distribution"):
        for event in engine.stream(
            [5, 6, 7],
            SamplingConfig(temperature=temperature, max_new_tokens=8),
            SpeculationConfig(gamma=gamma, mode=mode),
        ):
            events.append(event)
    assert not [e for e in events if isinstance(e, Token)]


def test_penalties_shrink_the_logits_of_the_last_64_ids_as_llama_cpp_does():
    from specchat.speculative.sampling import PENALTY_WINDOW, penalize

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0], [2.0, -1.0, 0.5, 3.0, 0.0]])
    params = SamplingConfig(repeat_penalty=2.0, presence_penalty=0.25)
    out = penalize(logits, [[0, 1, 1, 9], [3]], params)  # 9: past the vocabulary, ignored
    assert torch.equal(out[0], torch.tensor([2.0 / 2 - 0.25, -1.0 * 2 - 0.25, 0.5, 3.0, 0.0]))
    assert torch.equal(out[1], torch.tensor([2.0, -1.0, 0.5, 3.0 / 2 - 0.25, 0.0]))
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0]))  # not in place
    old = [2] + [4] * PENALTY_WINDOW  # id 2 fell out of the window
    assert penalize(logits[:1], [old], params)[0, 2] == 0.5
    assert penalize(logits, [[0], [0]], SamplingConfig()) is logits  # off: untouched
