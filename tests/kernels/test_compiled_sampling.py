"""kernels/sampling.cpp: the compiled sampling probabilities against spec/sampling.py's torch code, on rows as
wide as the bundled vocabulary (the definitions themselves: tests/spec/test_sampling.py, on both codes)."""
from __future__ import annotations

import pytest
import torch

import specchat.spec.sampling as sampling
from specchat.config import SamplingConfig


def torch_probs(logits, params, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(sampling, "_native_probs", None)
        return sampling.probs_from_logits(logits, params)


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 0.9), (1.0, 0, 1.0), (0.7, 40, 0.9), (1.2, 0, 0.5)])
def test_wide_rows_keep_the_torch_codes_tokens_at_its_probabilities(kernel, monkeypatch, temperature, top_k, top_p):
    """Six rows of 151,936 logits, peaked as a model's are (a few far above the rest) and flat."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 151_936, generator=generator) * torch.tensor([[3.0], [3.0], [1.0], [1.0], [0.3], [0.3]])
    logits[:2, :20] += 12  # a handful of likely tokens, as after a clear context
    params = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    expected = torch_probs(logits, params, monkeypatch)
    got = kernel.top_p_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, expected > 0)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-9)
    assert torch.allclose(got.double().sum(dim=-1), torch.ones(6, dtype=torch.float64), atol=1e-5)


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


def test_the_modules_loader_hands_its_probabilities_to_sampling(kernel):
    assert sampling._native_probs is kernel.top_p_probs
