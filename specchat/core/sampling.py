"""Logits -> probabilities, applied identically to target (p) and drafter (q). Pure tensor code.

Nothing here edits its input in place: logits that are reused stay intact.
"""
from __future__ import annotations

import torch

from specchat.config import SamplingConfig


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def probs_from_logits(logits: torch.Tensor, params: SamplingConfig) -> torch.Tensor:
    """[n, vocab] logits -> [n, vocab] float32 probabilities after temperature, top-k, top-p.

    Greedy (temperature 0 or greedy=True) gives one-hot argmax rows.
    """
    logits = logits.float()
    if params.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        scaled = _mask_top_p(scaled, params.top_p)
    return torch.softmax(scaled, dim=-1)


def _mask_top_p(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches top_p (ties kept)."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [n, vocab]
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False  # always keep the most likely token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf"))


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one id per row of [n, vocab] probs -> [n] int64."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def pick(logits: torch.Tensor, params: SamplingConfig, generator: torch.Generator
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Choose the next id from [1, vocab] logits. Returns (id [1], probs [1, vocab] or None when greedy)."""
    if params.is_greedy:
        return logits.argmax(dim=-1), None
    probs = probs_from_logits(logits, params)
    return sample(probs, generator), probs
