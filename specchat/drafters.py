"""Drafters propose tokens for the target to verify.

Protocol: `propose(ids, k, params, generator) -> Draft` and `rollback(committed_len)`.
A drafter keeps its own state (e.g. a KV cache) in step with the committed sequence `ids`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from specchat import kvcache
from specchat.config import SamplingConfig
from specchat.sampling import pick


@dataclass
class Draft:
    tokens: torch.Tensor          # [k] int64
    q_probs: torch.Tensor | None  # [k, vocab] drafter probabilities (None when greedy)
    forwards: list[tuple[int, float]]  # (tokens fed, seconds) per drafter forward


class Drafter(Protocol):
    def propose(self, ids: list[int], k: int, params: SamplingConfig,
                generator: torch.Generator) -> Draft: ...

    def rollback(self, committed_len: int) -> None: ...

    def reset(self) -> None: ...


class ModelDrafter:
    """A small causal LM with its own KV cache. It sees only tokens it has not seen yet."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's real vocabulary; padded logits are ignored
        self.cache = kvcache.new_cache(model)

    def reset(self) -> None:
        self.cache = kvcache.new_cache(self.model)

    @property
    def seen(self) -> int:
        return kvcache.cache_length(self.cache)

    def rollback(self, committed_len: int) -> None:
        """Keep at most committed_len - 1 tokens: the newest committed token is fed next step."""
        kvcache.crop_to(self.cache, min(self.seen, committed_len - 1))

    def sync(self, ids: list[int]) -> None:
        """Bring the cache up to ids[:-1] (a prompt prefill) so a later propose feeds one token."""
        missing = ids[self.seen:-1]
        if missing:
            kvcache.forward(self.model, self.cache, missing, keep=1)

    def propose(self, ids: list[int], k: int, params: SamplingConfig,
                generator: torch.Generator) -> Draft:
        tokens, probs, forwards = [], [], []
        feed = ids[self.seen:]  # [>=1] tokens: the newest committed one, plus any catch-up
        device = self.model.get_input_embeddings().weight.device
        step_ids = torch.tensor([feed], dtype=torch.long, device=device)  # [1, n]
        for _ in range(k):
            start = time.perf_counter()
            logits = kvcache.forward_tensor(self.model, self.cache, step_ids, keep=1)
            token, q = pick(logits[:, :self.vocab_size], params, generator)  # [1], [1, vocab]
            forwards.append((step_ids.shape[1], time.perf_counter() - start))
            tokens.append(token)
            probs.append(q)
            step_ids = token.view(1, 1)
        q_probs = torch.cat(probs) if probs and probs[0] is not None else None
        return Draft(torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long),
                     q_probs, forwards)
