"""The text drafter: a drafter model whose tokenizer is not the target's (transformers' universal assisted
decoding, llama.cpp's vocabulary translation).

It reads the conversation in its own ids (retokenize.TextMirror: the committed text, encoded by its tokenizer,
its cache cropped back to the ids that still agree), drafts in them, and its draft's text is re-tokenized into
the target's ids after the committed text's tail; the last of those ids is dropped, since more text could
still change it. They are proposed one-hot, as prompt lookup's copies are (q = 1 on each): the rejection rule
accepts a proposed token x with probability p(x) and otherwise resamples p without x, so greedy and sampled
output stay exactly the target's. When the target verifies the draft, the drafter proposes its most likely
tokens: one-hot drafts are accepted with probability p(x), which is highest for the likeliest x; a drafter
sharing the target's ids is accepted with probability sum(min(p, q)) instead. In drafter-only mode it samples
as configured, so that mode shows the drafter's own law.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch

from specchat.config import SamplingConfig
from specchat.speculative.drafters.base import Draft, DraftPlan, DraftView, TargetRows
from specchat.speculative.drafters.copies import copy_draft
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.drafters.retokenize import (
    TextMirror,
    TextTokenizer,
    common_prefix,
    continuation_ids,
    decode,
    special_tokens,
)
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler

TAIL = 8  # newest committed target ids the draft's text is re-tokenized after
CONTEXT = 4  # newest drafter ids decoded with the draft, so that a leading space of its first token stays


def text_ends(target_tokenizer: TextTokenizer, drafter_tokenizer: TextTokenizer) -> dict[int, int | None]:
    """Each special drafter id -> the target id it ends the draft's text with: the target's special token of
    the same name where there is one, else its EOS (a special token mid-draft ends the drafter's turn)."""
    target = special_tokens(target_tokenizer)
    eos: int | None = getattr(target_tokenizer, "eos_token_id", None)
    return {i: target.get(name, eos) for name, i in special_tokens(drafter_tokenizer).items()}


class TextDrafter:
    """Follows the Drafter protocol; proposes target ids for a drafter model that speaks another tokenizer."""

    def __init__(
        self,
        model: Model,
        target_tokenizer: TextTokenizer,
        drafter_tokenizer: TextTokenizer,
        vocab_size: int,
        sampler: Sampler = TORCH_SAMPLER,
        view: DraftView = DraftView(),
    ) -> None:
        self.target_tokenizer, self.drafter_tokenizer = target_tokenizer, drafter_tokenizer
        self.ends = text_ends(target_tokenizer, drafter_tokenizer)
        # drafts in the drafter's own ids, where its special ids stand for the target's stop ids
        own_view = dataclasses.replace(view, always_ids=frozenset(self.ends))
        self.inner = ModelDrafter(model, len(drafter_tokenizer), sampler, own_view)
        self.view = view
        self.vocab_size = vocab_size  # the target's
        self.mirror = TextMirror(target_tokenizer, drafter_tokenizer)
        self.stream: list[int] = []  # the drafter ids its cache stands for (a prefix of them)
        self.seen = 0  # committed target ids it has read

    @property
    def model(self) -> Model:
        return self.inner.model

    def fresh(self, view: DraftView) -> TextDrafter:
        """A drafter on the same model and tokenizers with a cache of its own and `view`."""
        inner = self.inner
        return TextDrafter(
            inner.model, self.target_tokenizer, self.drafter_tokenizer, self.vocab_size, inner.sampler, view
        )

    def reset(self) -> None:
        self.inner.reset()
        self.mirror.reset()
        self.stream, self.seen = [], 0

    def observe(self, ids: list[int], read: int = 0, target: TargetRows | None = None) -> int:
        """Nothing to crop yet: the next read of the conversation crops the cache to the ids that still agree. With
        `read`, ids[:read] are read now, in the drafter's own ids."""
        self.seen = min(self.seen, len(ids) - 1)
        if read:
            stream = self._sync(ids[:read])
            if stream:
                self.inner.read_to(stream, len(stream) - 1)
        return self.seen

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """Up to plan.gamma target ids: the text of plan.gamma + 1 drafter tokens, re-tokenized."""
        stream = self._sync(ids)
        if not stream:
            return copy_draft([], sampling, self.vocab_size)
        law = dataclasses.replace(sampling, greedy=True) if plan.verified else sampling
        # the plan's calibration is learnt from the one-hot drafts' confidences (1.0 each), not from the model's own
        own = dataclasses.replace(plan, gamma=plan.gamma + 1, confidence_scale=1.0)
        draft = self.inner.propose(stream, own, law, generator)
        drafted = draft.tokens.tolist()
        self.stream = stream + drafted  # the cache holds all but the newest drafted id
        proposal = self._target_ids(ids, stream, drafted, final=not plan.verified)
        return dataclasses.replace(
            copy_draft(proposal[: min(plan.gamma, plan.room)], sampling, self.vocab_size),
            forwards=draft.forwards,
            source="text",
        )

    def _sync(self, ids: list[int]) -> list[int]:
        """The conversation in the drafter's ids; its cache cropped to the ids it shares with what it held."""
        stream = self.mirror.update(ids)
        if not stream:
            self.inner.reset()
        else:
            self.inner.crop(min(common_prefix(self.stream, stream), len(stream) - 1))
        self.stream, self.seen = stream, len(ids)
        return stream

    def _target_ids(self, ids: list[int], stream: list[int], drafted: list[int], final: bool) -> list[int]:
        """The target's ids for the drafted tokens' text, after the committed ids. Drafter-only mode (`final`)
        keeps the last id, and there a draft of nothing the target can say ends the reply."""
        text, end = self._draft_text(stream, drafted)
        proposal = continuation_ids(self.target_tokenizer, decode(self.target_tokenizer, ids[-TAIL:]), text)
        if end is not None:
            return proposal + [end]
        if final:
            eos: int | None = getattr(self.target_tokenizer, "eos_token_id", None)
            return proposal or ([eos] if eos is not None else [])
        return proposal[:-1] if len(proposal) > 1 else proposal

    def _draft_text(self, stream: list[int], drafted: list[int]) -> tuple[str, int | None]:
        """The drafted tokens' text up to the first special one, and the target id that special one ends it with."""
        cut = next((i for i, token in enumerate(drafted) if token in self.ends), len(drafted))
        end = self.ends[drafted[cut]] if cut < len(drafted) else None
        context = stream[-CONTEXT:]
        head = decode(self.drafter_tokenizer, context)
        whole = decode(self.drafter_tokenizer, context + drafted[:cut])
        text = whole[len(head) :] if whole.startswith(head) else decode(self.drafter_tokenizer, drafted[:cut])
        return text, end


def drafter_for(
    model: Model,
    vocab_size: int,
    target_tokenizer: object,
    drafter_tokenizer: TextTokenizer | None = None,
    sampler: Sampler = TORCH_SAMPLER,
    view: DraftView = DraftView(),
) -> ModelDrafter | TextDrafter:
    """The drafter for a drafter model: on the target's ids, or (given a tokenizer of its own) on text, where the
    target's tokenizer is a whole one too (loading gives a drafter a tokenizer only beside the target's own)."""
    if drafter_tokenizer is None:
        return ModelDrafter(model, vocab_size, sampler, view)
    return TextDrafter(model, cast(TextTokenizer, target_tokenizer), drafter_tokenizer, vocab_size, sampler, view)
