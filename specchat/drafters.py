"""Drafters propose tokens for the target to verify.

Protocol: `propose(ids, k, params, generator) -> Draft` and `rollback(committed_len)`.
A drafter keeps its own state (e.g. a KV cache) in step with the committed sequence `ids`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specchat import kvcache
from specchat.config import SamplingConfig
from specchat.draft_vocab import DraftVocab
from specchat.sampling import pick


@dataclass
class Draft:
    tokens: torch.Tensor          # [k] int64
    q_probs: torch.Tensor | None  # [k, vocab] drafter probabilities (None when greedy)
    forwards: list[tuple[int, float]]  # (tokens fed, seconds) per drafter forward
    confidences: list[float] = field(default_factory=list)  # per token, when a draft may end early


def confidence(logits: torch.Tensor, position: torch.Tensor, q: torch.Tensor | None) -> float:
    """The drafter's probability for the token it chose: q(x) when sampling, softmax max when greedy."""
    if q is not None:
        return float(q[0, position])
    logits = logits.float()
    return float(torch.exp(logits.max() - torch.logsumexp(logits, dim=-1)))


class Drafter(Protocol):
    def propose(self, ids: list[int], k: int, params: SamplingConfig,
                generator: torch.Generator, path_floor: float = 0.0) -> Draft: ...

    def rollback(self, committed_len: int) -> None: ...

    def reset(self) -> None: ...


class ModelDrafter:
    """A small causal LM with its own KV cache. It sees only tokens it has not seen yet."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's real vocabulary; padded logits are ignored
        self.cache = kvcache.new_cache(model)
        self.vocab_limit = 0          # 0: score the whole vocabulary; see draft_vocab.py
        self.always_ids: frozenset[int] = frozenset()
        self.min_confidence = 0.0     # stop drafting after a token the drafter gives less than this
        self._vocab: DraftVocab | None = None

    def configure(self, vocab_limit: int, always_ids, min_confidence: float = 0.0) -> None:
        """Use a DraftVocab of ids below vocab_limit (+ seen ids + always_ids), 0 turns it off;
        and stop a draft early after a token whose drafter probability is below min_confidence."""
        if vocab_limit != self.vocab_limit or frozenset(always_ids) != self.always_ids:
            self._vocab = None
        self.vocab_limit, self.always_ids = vocab_limit, frozenset(always_ids)
        self.min_confidence = min_confidence

    def reset(self) -> None:
        self.cache = kvcache.new_cache(self.model)
        self._vocab = None

    @property
    def seen(self) -> int:
        return kvcache.cache_length(self.cache)

    def rollback(self, committed_len: int) -> None:
        """Keep at most committed_len - 1 tokens: the newest committed token is fed next step."""
        kvcache.crop_to(self.cache, min(self.seen, committed_len - 1))

    def propose(self, ids: list[int], k: int, params: SamplingConfig,
                generator: torch.Generator, path_floor: float = 0.0) -> Draft:
        """Up to k tokens. The draft ends early after a token whose confidence is below
        min_confidence, or once the product of the confidences so far is below path_floor."""
        tokens, probs, forwards, confidences = [], [], [], []
        path = 1.0  # the drafter's own probability that every token so far is right
        feed = ids[self.seen:]  # [>=1] tokens: the newest committed one, plus any catch-up
        device = self.model.get_input_embeddings().weight.device
        step_ids = torch.tensor([feed], dtype=torch.long, device=device)  # [1, n]
        vocab = self._draft_vocab(ids)
        for _ in range(k):
            start = time.perf_counter()
            logits = self._next_logits(step_ids, vocab)  # [1, width]
            position, q = pick(logits, params, generator)  # [1], [1, width] or None when greedy
            token = vocab.to_ids(position) if vocab else position
            forwards.append((step_ids.shape[1], time.perf_counter() - start))
            tokens.append(token)
            probs.append(q)
            step_ids = token.view(1, 1)
            if self.min_confidence or path_floor:
                sure = confidence(logits, position, q)
                confidences.append(sure)
                path *= sure
                if sure < self.min_confidence or path < path_floor:
                    break  # a draft the drafter itself doubts is likely rejected: verify what we have
        q_probs = torch.cat(probs) if probs and probs[0] is not None else None
        if q_probs is not None and vocab:
            q_probs = vocab.full_width(q_probs, self.vocab_size)
        return Draft(torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long),
                     q_probs, forwards, confidences)

    def _draft_vocab(self, ids: list[int]) -> DraftVocab | None:
        if not self.vocab_limit or self.vocab_limit >= self.vocab_size:
            return None
        if self._vocab is None:
            self._vocab = DraftVocab(self.model.get_output_embeddings(), self.vocab_limit, self.always_ids)
        self._vocab.update(ids)
        return self._vocab

    @torch.inference_mode()
    def _next_logits(self, step_ids: torch.Tensor, vocab: DraftVocab | None) -> torch.Tensor:
        """[1, width] logits for the next token over the whole vocabulary, or over a DraftVocab."""
        if vocab is None:
            logits = kvcache.forward_tensor(self.model, self.cache, step_ids, keep=1)
            return logits[:, :self.vocab_size]
        return vocab.logits(kvcache.hidden_tensor(self.model, self.cache, step_ids))  # [1, hidden] -> [1, width]
