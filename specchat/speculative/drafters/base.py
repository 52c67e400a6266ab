"""Drafters propose tokens for the target to verify.

Every drafter follows the `Drafter` protocol: `propose(ids, plan, sampling, generator) -> Draft`,
`observe(ids, read)` (the committed sequence after a step or a new prompt; it rolls back what disagrees and reads a
prompt's chunk when asked) and `reset()`. A drafter keeps its own state (e.g. a KV cache) in step with the committed
sequence `ids`. What a drafter model reads and scores (DraftView) is given when it is built, not through the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specchat.config import SamplingConfig
from specchat.speculative.constraint import Constraint
from specchat.speculative.drafters.vocab import DraftVocab
from specchat.speculative.insight import drafter_top
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler


@dataclass(frozen=True)
class DraftView:
    """What a drafter model reads and scores, set when it is built (speculation settings; a new view: a new drafter)."""

    vocab_limit: int = 0  # 0: score the whole vocabulary; else ids below it, seen ones and always_ids (vocab.py)
    always_ids: frozenset[int] = frozenset()  # ids always scored: the target's stop ids
    lookup: bool = False  # check prompt-lookup guesses alongside the current token (lookup.py)
    context: int = 0  # 0: the whole conversation in the cache; else its start and end (context.py)


@dataclass(frozen=True)
class DraftPlan:
    """One step's drafting: at most `gamma` tokens. The draft ends early after a token whose drafter
    probability is below `min_confidence`, or once the estimated chance that all its tokens are
    accepted (the product of min(1, confidence_scale * confidence)) is below `path_floor`."""

    gamma: int  # the drafter model's tokens (0: the model drafts nothing this step)
    path_floor: float = 0.0  # 0: no early end by the path
    confidence_scale: float = 1.0
    min_confidence: float = 0.0  # 0: no early end by one doubtful token
    room: int = 1 << 30  # tokens the reply has left after the target's own: no draft goes past it
    verified: bool = False  # the target verifies the draft (drafter-only mode: no): a drafter whose q is
    #                                one-hot then proposes its most likely tokens, which p accepts most often
    copy: int = 0  # tokens a copy from the conversation may draft, decided apart from gamma (copy_length.py)
    constraint: Constraint | None = None  # the rules on the target's law (constraint.py): a drafter model applies
    #                                       them to q too, so that it drafts what the target may accept

    @property
    def drafts(self) -> bool:
        """Whether the step asks its drafter at all: for the model's tokens, or for a copy."""
        return self.gamma > 0 or self.copy > 0

    @property
    def tracks_confidence(self) -> bool:
        return bool(self.min_confidence or self.path_floor)


@dataclass(frozen=True)
class DraftRows:
    """The logits each drafted token came from (/why's drafter top tokens): per token [1, width], and the map from
    a row's positions to ids where the drafter scores a subset of its vocabulary (vocab.py)."""

    logits: list[torch.Tensor]
    vocab: DraftVocab | None = None


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # [k] int64, on the drafter's device
    q_probs: torch.Tensor | None  # [k, vocab] drafter probabilities (None when greedy)
    forwards: list[tuple[int, float]]  # (tokens fed, seconds) per drafter forward
    confidences: list[float] = field(default_factory=list)  # per token: the drafter's q of it (see `sure`)
    sure: torch.Tensor | None = None  # [k] the confidences on the device; until the step reads them back with
    #                                   its verdict (step.py), `confidences` may be empty
    rows: DraftRows | None = None  # the logits it came from (None: no distribution, as a copy's one-hot q)
    source: str = "model"  # what drafted it: model (a drafter model) | lookup (copied from the conversation) |
    #                        text (a drafter model of another tokenizer, its text re-tokenized: text.py)

    @property
    def copied(self) -> bool:
        """A copy from the conversation: auto gamma learns no alpha or c of the drafter model from it."""
        return self.source == "lookup"

    def top_at(
        self, position: int, sampling: SamplingConfig, sampler: Sampler = TORCH_SAMPLER
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The drafter's most likely tokens and their probabilities where it drafted tokens[position] (/why),
        on the device; None for a drafter without a distribution (prompt lookup: q is one-hot)."""
        if self.rows is None or not self.rows.logits:
            return None
        row, vocab = self.rows.logits[position], self.rows.vocab
        ids = vocab.to_ids(torch.arange(row.shape[-1], device=row.device)) if vocab else None
        return drafter_top(row, sampling, ids, sampler)


@dataclass(frozen=True)
class TargetRows:
    """The target's last hidden states (after its final norm) at positions start, start+1, ... of the committed
    sequence, from a forward the target ran anyway (a step's verification, a prompt's chunk): a draft head reads them
    (head.py); other drafters let them pass."""

    start: int
    hidden: torch.Tensor  # [rows, hidden], on the target's device

    @property
    def end(self) -> int:
        """The position after the last row."""
        return self.start + self.hidden.shape[0]


class Drafter(Protocol):
    def propose(
        self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator
    ) -> Draft: ...

    def observe(self, ids: list[int], read: int = 0, target: TargetRows | None = None) -> int:
        """The committed sequence is now `ids`; read ids[:read] now where read > 0; `target`: the target's hidden
        states of some of its positions, where its last forward kept them. Returns how many of ids its state
        stands for (0 for a drafter without a cache)."""
        ...

    def reset(self) -> None: ...


class CachedDrafter(Drafter, Protocol):
    """A drafter model's Drafter: fresh(view) gives one on the same model with a cache of its own and that view
    (Engine.fork; the engine's view changed)."""

    @property
    def model(self) -> Model: ...  # the drafter model itself (what the engine's clock waits for on a GPU)

    @property
    def view(self) -> DraftView: ...  # what it reads and scores

    def fresh(self, view: DraftView) -> CachedDrafter: ...


class DrafterUnusable(ValueError):
    """A drafter name that cannot draft here; the message is one line for the user."""


@dataclass(frozen=True)
class DrafterSetup:
    """What a drafter kind's constructor may build on (drafters/registry.py)."""

    target: Model
    model: Drafter | None  # the drafter model's Drafter (None: no drafter model is loaded)
    vocab_size: int
    sampler: Sampler = TORCH_SAMPLER  # computes q: the engine's, the one its step computes p with
    view: DraftView = DraftView()  # what a drafter model reads and scores
