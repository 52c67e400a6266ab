"""Drafters propose tokens for the target to verify.

Protocol: `propose(ids, k, params, generator, path_floor, confidence_scale) -> Draft` and
`rollback(committed_len)`.
A drafter keeps its own state (e.g. a KV cache) in step with the committed sequence `ids`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specchat.core import kvcache
from specchat.config import SamplingConfig
from specchat.core.draft_vocab import DraftVocab
from specchat.core.lookup import MAX_GUESS, WINDOW, continuation
from specchat.core.sampling import pick


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
    def propose(self, ids: list[int], k: int, params: SamplingConfig, generator: torch.Generator,
                path_floor: float = 0.0, confidence_scale: float = 1.0) -> Draft: ...

    def rollback(self, committed_len: int) -> None: ...

    def reset(self) -> None: ...


class ModelDrafter:
    """A small causal LM with its own KV cache. It sees only tokens it has not seen yet."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # the tokenizer's real vocabulary; padded logits are ignored
        self.cache = kvcache.new_cache(model)
        self.device = model.get_input_embeddings().weight.device
        self.vocab_limit = 0          # 0: score the whole vocabulary; see draft_vocab.py
        self.always_ids: frozenset[int] = frozenset()
        self.min_confidence = 0.0     # stop drafting after a token the drafter gives less than this
        self.lookup = False           # check prompt-lookup guesses in the same forward (lookup.py)
        self._vocab: DraftVocab | None = None

    def configure(self, vocab_limit: int, always_ids, min_confidence: float = 0.0,
                  lookup: bool = False) -> None:
        """Use a DraftVocab of ids below vocab_limit (+ seen ids + always_ids), 0 turns it off;
        stop a draft early after a token whose drafter probability is below min_confidence;
        and check prompt-lookup guesses alongside the current token (lookup)."""
        if vocab_limit != self.vocab_limit or frozenset(always_ids) != self.always_ids:
            self._vocab = None
        self.vocab_limit, self.always_ids = vocab_limit, frozenset(always_ids)
        self.min_confidence, self.lookup = min_confidence, lookup

    def reset(self) -> None:
        self.cache = kvcache.new_cache(self.model)
        self._vocab = None

    @property
    def seen(self) -> int:
        return kvcache.cache_length(self.cache)

    def rollback(self, committed_len: int) -> None:
        """Keep at most committed_len - 1 tokens: the newest committed token is fed next step."""
        kvcache.crop_to(self.cache, min(self.seen, committed_len - 1))

    def propose(self, ids: list[int], k: int, params: SamplingConfig, generator: torch.Generator,
                path_floor: float = 0.0, confidence_scale: float = 1.0) -> Draft:
        """Up to k tokens. The draft ends early after a token whose confidence is below
        min_confidence, or once the product of min(1, confidence_scale * confidence) over the
        tokens so far is below path_floor."""
        drafting = _Drafting(k, params, generator, self._draft_vocab(ids),
                             self.min_confidence, path_floor, confidence_scale)
        feed = ids[self.seen:]  # [>=1] tokens: the newest committed one, plus any catch-up
        while not drafting.finished:
            guess = self._guess(ids, drafting.tokens, k - len(drafting.tokens) - 1)
            self._draft_forward(feed, guess, drafting)
            feed = drafting.tokens[-1:]
        return drafting.draft(self.vocab_size)

    def _guess(self, ids: list[int], drafted: list[int], room: int) -> list[int]:
        """Prompt-lookup tokens to check in the same forward as the current token (lookup.py)."""
        if not self.lookup or room <= 0:
            return []
        return continuation(ids[-WINDOW:] + drafted, min(room, MAX_GUESS))

    def _draft_forward(self, feed: list[int], guess: list[int], drafting: "_Drafting") -> None:
        """One forward over feed + guess; draft from its rows while the guess matches what was drafted.

        Row j is conditioned on guess[:j], so it is the drafter's own next-token distribution as long
        as every earlier guessed token is the one drafted. The cache keeps only that matching part.
        """
        start, before = time.perf_counter(), self.seen
        step_ids = torch.tensor([feed + guess], dtype=torch.long, device=self.device)  # [1, fed]
        rows = self._next_logits(step_ids, drafting.vocab, keep=len(guess) + 1)  # [len(guess)+1, width]
        used = 0
        for j in range(len(guess) + 1):
            token = drafting.add(rows[j:j + 1])
            if drafting.finished or j == len(guess) or token != guess[j]:
                used = j
                break
        kvcache.crop_to(self.cache, before + len(feed) + used)
        drafting.forwards.append((len(feed) + len(guess), time.perf_counter() - start))

    def _draft_vocab(self, ids: list[int]) -> DraftVocab | None:
        if not self.vocab_limit or self.vocab_limit >= self.vocab_size:
            return None
        if self._vocab is None:
            self._vocab = DraftVocab(self.model.get_output_embeddings(), self.vocab_limit, self.always_ids)
        self._vocab.update(ids)
        return self._vocab

    @torch.inference_mode()
    def _next_logits(self, step_ids: torch.Tensor, vocab: DraftVocab | None, keep: int) -> torch.Tensor:
        """[keep, width] logits of the last `keep` positions, over the whole vocabulary or a DraftVocab."""
        if vocab is None:
            logits = kvcache.forward_tensor(self.model, self.cache, step_ids, keep=keep)
            return logits[:, :self.vocab_size]
        return vocab.logits(kvcache.hidden_tensor(self.model, self.cache, step_ids, keep))  # [keep, width]


class _Drafting:
    """One draft in progress: its tokens, q rows, confidences, and when it must end."""

    def __init__(self, k: int, params: SamplingConfig, generator: torch.Generator, vocab: DraftVocab | None,
                 min_confidence: float, path_floor: float, confidence_scale: float):
        self.k, self.params, self.generator, self.vocab = k, params, generator, vocab
        self.min_confidence, self.path_floor, self.confidence_scale = min_confidence, path_floor, confidence_scale
        self.tokens: list[int] = []
        self.probs: list[torch.Tensor | None] = []
        self.confidences: list[float] = []
        self.forwards: list[tuple[int, float]] = []
        self.path = 1.0      # estimated probability that every token so far is accepted
        self.doubt = False   # a token fell below min_confidence or the path below path_floor

    @property
    def finished(self) -> bool:
        return self.doubt or len(self.tokens) >= self.k

    def add(self, logits: torch.Tensor) -> int:
        """Draft one token from [1, width] logits; returns its id."""
        position, q = pick(logits, self.params, self.generator)  # [1], [1, width] or None when greedy
        token = int(self.vocab.to_ids(position) if self.vocab else position)
        self.tokens.append(token)
        self.probs.append(q)
        if self.min_confidence or self.path_floor:
            sure = confidence(logits, position, q)
            self.confidences.append(sure)
            self.path *= min(1.0, self.confidence_scale * sure)
            # a draft the drafter itself doubts is likely rejected: verify what we have
            self.doubt = sure < self.min_confidence or self.path < self.path_floor
        return token

    def draft(self, vocab_size: int) -> Draft:
        q_probs = torch.cat(self.probs) if self.probs and self.probs[0] is not None else None
        if q_probs is not None and self.vocab:
            q_probs = self.vocab.full_width(q_probs, vocab_size)
        return Draft(torch.tensor(self.tokens, dtype=torch.long), q_probs, self.forwards, self.confidences)
