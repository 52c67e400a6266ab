"""The models an engine runs on: one type for the loader (a LoadedPair is a Pair with its facts) and the engine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specchat.speculative.drafters.retokenize import TextTokenizer
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler


@dataclass(frozen=True)
class Pair:
    target: Model
    drafter: Model | None
    tokenizer: Any  # the target's (detok.Tokenizer; a whole transformers tokenizer where the drafter drafts text)
    eos_ids: Iterable[int]
    vocab_size: int
    drafter_tokenizer: TextTokenizer | None = None  # the drafter's own tokenizer where it drafts text (text.py)
    sampler: Sampler = TORCH_SAMPLER  # what computes p, q and greedy rows: the compiled module's with w4a8
