"""kernels/sampling.cpp: the compiled sampling probabilities against speculative/sampling.py's torch code, on rows as
wide as the bundled vocabulary (the definitions themselves: tests/speculative/test_sampling.py, on both codes)."""

from __future__ import annotations

import pytest
import torch

import specchat.speculative.sampling as sampling
from specchat.config import SamplingConfig


def torch_probs(logits, params, monkeypatch):
    return sampling.probs_from_logits(logits, params)  # the torch code whatever was loaded: nothing patches it


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 0.9), (1.0, 0, 1.0), (0.7, 40, 0.9), (1.2, 0, 0.5)])
def test_wide_rows_keep_the_torch_codes_tokens_at_its_probabilities(kernel, monkeypatch, temperature, top_k, top_p):
    """Six rows of 151,936 logits, peaked as a model's are (a few far above the rest) and flat. The nucleus' last
    token may differ where the mass before it is top_p to float32's rounding (torch's float cumsum against the
    kernel's double sums: on a Zen 3, one token of a 67,113-token nucleus, 7.8e-8 below 0.9)."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 151_936, generator=generator) * torch.tensor([[3.0], [3.0], [1.0], [1.0], [0.3], [0.3]])
    logits[:2, :20] += 12  # a handful of likely tokens, as after a clear context
    params = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    expected = torch_probs(logits, params, monkeypatch)
    got = kernel.top_p_probs(logits, temperature, top_k, top_p)
    differ = (got > 0) != (expected > 0)
    assert int(differ.sum()) <= 2 * 6
    for row, token in differ.nonzero().tolist():  # summed in another order, the mass before it rounds to either side
        assert abs(exact_mass_before(logits[row], temperature, top_k, token) - top_p) < 1e-5, (row, token)
    both = (got > 0) & (expected > 0)
    assert torch.allclose(got[both], expected[both], rtol=1e-4, atol=1e-9)
    assert torch.allclose(got.double().sum(dim=-1), torch.ones(6, dtype=torch.float64), atol=1e-5)


def exact_mass_before(logits, temperature, top_k, token) -> float:
    """The probability mass (in float64, after top-k) of the tokens more likely than `token` in this row."""
    scaled = logits.double() / temperature
    if top_k:
        scaled = scaled.masked_fill(scaled < torch.topk(scaled, top_k).values[-1], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return float(probs[probs > probs[token]].sum())


def test_a_nucleus_past_the_likely_tokens_is_found_among_all(kernel, monkeypatch):
    """A flat row of 200,000 tokens: each is below the first search's 1e-4, so the nucleus needs the wider ones."""
    logits = torch.randn(1, 200_000, generator=torch.Generator().manual_seed(6)) * 0.05
    params = SamplingConfig(temperature=1.0, top_p=0.8)
    expected = torch_probs(logits, params, monkeypatch)
    got = kernel.top_p_probs(logits, 1.0, 0, 0.8)
    assert 100_000 < int((got > 0).sum()) < 200_000
    assert torch.equal(got > 0, expected > 0)


def test_a_row_with_a_nan_gives_nans_and_the_other_rows_their_own(kernel):
    logits = torch.randn(3, 1000)
    alone = kernel.top_p_probs(logits[2:], 0.7, 0, 0.9)
    logits[1, 17] = float("nan")
    got = kernel.top_p_probs(logits, 0.7, 0, 0.9)
    assert torch.isnan(got[1]).all() and not torch.isnan(got[[0, 2]]).any()
    assert torch.equal(got[2:], alone)


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.0, 0.9, 0), (0.7, 0.0, 0), (0.7, 1.5, 0), (0.7, 0.9, -1)])
def test_bad_settings_are_refused(kernel, temperature, top_p, top_k):
    with pytest.raises(RuntimeError, match="temperature > 0, top_p in"):
        kernel.top_p_probs(torch.randn(1, 10), temperature, top_k, top_p)


def test_compiled_probs_take_the_modules_rows_on_the_cpu_and_the_torch_code_elsewhere(kernel):
    """The Sampler a pair on the module samples with (loading/models.py): its sampled CPU rows are the module's,
    greedy rows the torch code's one-hot; loading the module changes nothing else (probs_from_logits stays torch)."""
    probs = sampling.CompiledSampler(kernel.top_p_probs).probs
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(7))
    params = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    assert torch.equal(probs(logits, params), kernel.top_p_probs(logits, 0.7, 5, 0.9))
    greedy = SamplingConfig(temperature=0.0)
    assert torch.equal(probs(logits, greedy), sampling.probs_from_logits(logits, greedy))
    assert "_native_probs" not in vars(sampling) and "use_native_probs" not in vars(sampling)


def non_finite_rows(width: int = 1000) -> torch.Tensor:
    """A clean row, rows with no finite largest logit (one +inf, two, +inf beside -inf, all -inf), a row with a
    NaN, and a clean row with -inf entries (a masked vocabulary: an ordinary row)."""
    logits = torch.randn(8, width, generator=torch.Generator().manual_seed(9))
    logits[1, 17] = float("inf")
    logits[2, [3, width - 2]] = float("inf")  # one in the 8-wide lanes, one in the tail past them
    logits[3, :5], logits[3, 5] = float("-inf"), float("inf")
    logits[4] = float("-inf")
    logits[5, 40] = float("nan")
    logits[6, ::3] = float("-inf")
    return logits


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (0, 0.9), (5, 1.0), (5, 0.5), (2000, 0.999)])
def test_rows_with_no_finite_largest_logit_give_what_the_torch_code_gives_nans(kernel, monkeypatch, top_k, top_p):
    """+inf, all -inf and NaN rows: NaN probabilities on both codes (the torch code's inf - inf), never an exp of 0
    everywhere divided by its sum of 0 nor the last token of an empty nucleus; the other rows keep their own."""
    for width in (1000, 1003):  # the tail past the last 8 lanes too
        logits = non_finite_rows(width)
        params = SamplingConfig(temperature=0.7, top_k=top_k, top_p=top_p)
        expected = torch_probs(logits, params, monkeypatch)
        got = kernel.top_p_probs(logits, 0.7, top_k, top_p)
        assert expected[1:6].isnan().all() and not expected[[0, 6, 7]].isnan().any()  # the rule, on the torch code
        assert got[1:6].isnan().all() and not got[[0, 6, 7]].isnan().any()
        assert torch.equal(got[[0, 6, 7]] > 0, expected[[0, 6, 7]] > 0)
        assert torch.allclose(got[[0, 6, 7]], expected[[0, 6, 7]], rtol=1e-4, atol=1e-9)
        assert torch.equal(got[[0, 7]], kernel.top_p_probs(logits[[0, 7]], 0.7, top_k, top_p))


def test_no_vocabulary_and_an_infinite_temperature_are_refused(kernel):
    with pytest.raises(RuntimeError, match="at least one token wide"):
        kernel.top_p_probs(torch.randn(2, 0), 0.7, 0, 0.9)
    with pytest.raises(RuntimeError, match="temperature finite"):
        kernel.top_p_probs(torch.randn(2, 10), float("inf"), 0, 0.9)


# ----- greedy rows: argmax and log-sum-exp in two passes ------------------------------------------------------------


def greedy_cases() -> torch.Tensor:
    """Rows of the bundled vocabulary's width: peaked, flat, ties of the largest (in two lanes, in the tail past
    the 8-wide lanes, twice in one lane), the largest first and last."""
    width = 151_936
    logits = torch.randn(8, width, generator=torch.Generator().manual_seed(11)) * 3
    logits[0, :20] += 12
    logits[1] *= 0.01
    logits[2, [9, 4000, 70_001]] = 50.0  # three lanes hold the largest: the first index wins
    logits[3, [width - 1, width - 3]] = 50.0  # only in the tail (151,936 is a multiple of 8: the last lanes)
    logits[4, [5, 13]] = 50.0  # the same lane twice
    logits[5, 0] = 50.0
    logits[6, width - 1] = 50.0
    return logits


def test_greedy_rows_give_torchs_argmax_and_its_log_sum_exp(kernel):
    logits = greedy_cases()
    ids, totals = kernel.greedy_rows(logits)
    assert torch.equal(ids, logits.argmax(dim=-1))
    assert torch.allclose(totals, torch.logsumexp(logits, dim=-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("width", [1, 5, 8, 13, 1000])
def test_narrow_rows_and_rows_past_the_last_whole_lanes_too(kernel, width):
    logits = torch.randn(4, width, generator=torch.Generator().manual_seed(width))
    logits[1] = 2.0  # every entry tied
    logits[2, -1] = 9.0  # the largest in the tail
    ids, totals = kernel.greedy_rows(logits)
    assert torch.equal(ids, logits.argmax(dim=-1))
    assert torch.allclose(totals, torch.logsumexp(logits, dim=-1), rtol=1e-6, atol=1e-6)


def test_greedy_rows_with_nan_or_infinities_follow_torch(kernel):
    """torch's rules, not a law: a NaN is the largest and makes the sum NaN, +inf makes it inf, all -inf gives -inf."""
    logits = non_finite_rows()
    logits[6, [40, 900]] = float("nan")
    ids, totals = kernel.greedy_rows(logits)
    assert torch.equal(ids, logits.argmax(dim=-1))
    expected = torch.logsumexp(logits, dim=-1)
    assert torch.equal(torch.isnan(totals), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    assert torch.allclose(totals[finite], expected[finite], rtol=1e-6, atol=1e-6, equal_nan=False)


def test_the_pairs_greedy_is_the_modules_on_the_cpu_and_the_torch_code_elsewhere(kernel):
    sampler = sampling.CompiledSampler(kernel.top_p_probs, kernel.greedy_rows)
    logits = greedy_cases()[:3]
    native_ids, native_totals = kernel.greedy_rows(logits)
    ids, totals = sampler.greedy(logits)
    assert torch.equal(ids, native_ids) and torch.equal(totals, native_totals)
    assert torch.equal(sampling.TORCH_SAMPLER.greedy(logits)[0], sampling.greedy_rows(logits)[0])
    torch_ids, torch_totals = sampling.CompiledSampler(kernel.top_p_probs).greedy(logits)
    assert torch.equal(torch_ids, logits.argmax(dim=-1)) and torch.equal(torch_totals, torch.logsumexp(logits, -1))
