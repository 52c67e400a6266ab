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

    def __init__(self, model, vocab_size: int, vocab_limit: int = 0):
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's real vocabulary; padded logits are ignored
        # Propose only ids below this (0 = all). A cheaper output head; exactness is kept because
        # the target verifies against the q the drafter really sampled from.
        self.vocab_limit = vocab_limit
        self.cache = kvcache.new_cache(model)

    def reset(self) -> None:
        self.cache = kvcache.new_cache(self.model)

    @property
    def seen(self) -> int:
        return kvcache.cache_length(self.cache)

    def rollback(self, committed_len: int) -> None:
        """Keep at most committed_len - 1 tokens: the newest committed token is fed next step."""
        kvcache.crop_to(self.cache, min(self.seen, committed_len - 1))

    def propose(self, ids: list[int], k: int, params: SamplingConfig,
                generator: torch.Generator) -> Draft:
        tokens, probs, forwards = [], [], []
        feed = ids[self.seen:]  # [>=1] tokens: the newest committed one, plus any catch-up
        device = self.model.get_input_embeddings().weight.device
        step_ids = torch.tensor([feed], dtype=torch.long, device=device)  # [1, n]
        for _ in range(k):
            start = time.perf_counter()
            token, q = pick(self._next_logits(step_ids), params, generator)  # [1], [1, width]
            forwards.append((step_ids.shape[1], time.perf_counter() - start))
            tokens.append(token)
            probs.append(q)
            step_ids = token.view(1, 1)
        q_probs = self._full_width(torch.cat(probs)) if probs and probs[0] is not None else None
        return Draft(torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long),
                     q_probs, forwards)

    @torch.inference_mode()
    def _next_logits(self, step_ids: torch.Tensor) -> torch.Tensor:
        """[1, width] logits for the next token: the whole vocabulary, or only ids below vocab_limit."""
        if not self.vocab_limit or self.vocab_limit >= self.vocab_size:
            logits = kvcache.forward_tensor(self.model, self.cache, step_ids, keep=1)
            return logits[:, :self.vocab_size]
        hidden = kvcache.hidden_tensor(self.model, self.cache, step_ids)  # [1, hidden]
        head = self.model.get_output_embeddings()
        bias = head.bias[:self.vocab_limit] if head.bias is not None else None
        return torch.nn.functional.linear(hidden, head.weight[:self.vocab_limit], bias)

    def _full_width(self, q: torch.Tensor) -> torch.Tensor:
        """Pad [k, width] drafter probabilities to [k, vocab_size] with zeros for ids it never proposes."""
        if q.shape[-1] == self.vocab_size:
            return q
        return torch.nn.functional.pad(q, (0, self.vocab_size - q.shape[-1]))
