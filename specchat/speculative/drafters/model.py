"""The model drafter: a small model proposes tokens from its own KV cache, kept in step with the
committed sequence (the middle of a long one left out: context.py); it can score a subset of its
vocabulary (vocab.py) and try prompt lookup first."""

from __future__ import annotations

from typing import cast

import torch

from specchat.config import SamplingConfig
from specchat.speculative import model_io
from specchat.speculative.drafters.base import (
    Draft,
    Drafter,
    DrafterSetup,
    DrafterUnusable,
    DraftPlan,
    DraftRows,
    DraftView,
    TargetRows,
)
from specchat.speculative.drafters.context import MIN_GAP, ContextGap
from specchat.speculative.drafters.lookup import Guesser, NoGuess, PromptLookup, common_prefix_len
from specchat.speculative.drafters.vocab import DraftVocab, head_width
from specchat.speculative.readback import read_back
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler
from specchat.speculative.timing import clock


def chosen(
    logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator, sampler: Sampler
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The drafter's token from [1, width] logits: (its position [1], q [1, width] or None when greedy, its
    probability [1]), on the device: q(x) when sampling, the softmax's largest entry when greedy."""
    if sampling.is_greedy:
        position, total = sampler.greedy(logits)
        return position, None, torch.exp(logits[0, position].float() - total)
    position, law = sampler.pick(logits, sampling, generator)
    q = cast(torch.Tensor, law)  # a sampled pick gives its law
    return position, q, q[0, position]


class ModelDrafter:
    """A small causal LM with its own KV cache. It sees only tokens it has not seen yet."""

    def __init__(
        self, model: model_io.Model, vocab_size: int, sampler: Sampler = TORCH_SAMPLER, view: DraftView = DraftView()
    ) -> None:
        """`view`: score only ids below view.vocab_limit (+ seen ids + its always_ids; 0: all of them), check
        prompt-lookup guesses alongside the current token with view.lookup, and keep at most about view.context
        tokens of a long conversation (0: all of it)."""
        self.model = model
        self.view = view
        self.sampler = sampler  # computes q: the engine's, the one its step computes p with
        self.vocab_size = vocab_size  # the tokenizer's real vocabulary; padded logits are ignored
        # ids it scores: fewer than vocab_size where the target's vocabulary is padded wider (ids past it never drafted)
        self.width = min(vocab_size, head_width(model.get_output_embeddings()))
        self.kv = model_io.new_kv_cache(model)
        self.device = model_io.input_device(model)
        self.guesser: Guesser = PromptLookup() if view.lookup else NoGuess()  # checked in the same forward
        self.gap = ContextGap()
        self.history: list[int] = []  # the committed ids it last observed
        self._vocab: DraftVocab | None = None

    def fresh(self, view: DraftView) -> ModelDrafter:
        """A drafter on the same model with a cache of its own and `view`."""
        return ModelDrafter(self.model, self.vocab_size, self.sampler, view)

    def reset(self) -> None:
        self.kv = model_io.new_kv_cache(self.model)
        self.gap = ContextGap()
        self.history = []
        self._vocab = None

    def observe(self, ids: list[int], read: int = 0, target: TargetRows | None = None) -> int:
        """The committed sequence is now `ids`: keep what the cache holds of their common part with what it last
        observed (never the newest id: it is fed next step); with `read`, read ids[:read] now (a prompt's chunk).
        Returns how many of ids the cache stands for."""
        extends = ids[: len(self.history)] == self.history  # a step's tokens, or a next turn's prompt
        self.crop(len(ids) - 1 if extends else min(common_prefix_len(self.history, ids), len(ids) - 1))
        self.history = list(ids)
        if read:
            self.read_to(ids, read)
        return self.seen

    @property
    def cached(self) -> int:
        """Tokens in the cache."""
        return model_io.kv_length(self.kv)

    @property
    def seen(self) -> int:
        """Committed ids the cache stands for (a gap's ids count as seen)."""
        return self.gap.seen(self.cached)

    @property
    def _short_of_gap(self) -> bool:
        """A gap is planned and the cache has not reached its start yet."""
        return bool(self.gap.count) and self.cached < self.gap.start

    def crop(self, keep: int) -> None:
        """Keep at most the first `keep` committed ids in the cache (what agrees with the committed sequence)."""
        model_io.crop_to(self.kv, self.gap.cut(min(self.seen, keep)))
        if self._vocab is not None:
            self._vocab.keep_first(keep)

    @torch.inference_mode()
    def read_to(self, ids: list[int], upto: int) -> None:
        """Read ids[seen:upto] into the cache (a chunk of a long prompt), without scoring them; the middle of
        a conversation longer than the context limit is left out."""
        if self.gap.count and len(ids) - self.seen >= self.view.context + MIN_GAP:
            self.reset()  # a second long stretch (another paste): the chat's start and end read anew, not all of it
            self.history = list(ids)
        self.gap.open(self.view.context, len(ids), self.seen)
        if self._short_of_gap:  # up to the gap first, then past it
            self._read(ids[self.cached : min(upto, self.gap.start)])
        if upto > self.seen:
            self._read(ids[self.seen : upto])

    def _read(self, ids: list[int]) -> None:
        if ids:
            model_io.hidden_tensor(self.model, self.kv, self._tensor(ids).view(1, -1), 1)

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        """Committed ids as the drafter reads them, on its device: an id past those it scores (a padded target
        vocabulary's, never drafted) reads as its last one."""
        tensor = torch.tensor(ids, dtype=torch.long, device=self.device)
        return tensor.clamp_(max=self.width - 1) if self.width < self.vocab_size else tensor

    def propose(self, ids: list[int], plan: DraftPlan, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        """Up to plan.gamma tokens, ended early as the plan says.

        The tokens stay on the device, each fed to the next forward as it is, unless the host must see each one:
        to end the draft early on its confidence, or to look for prompt-lookup guesses after it."""
        if self._short_of_gap:
            self.read_to(ids, len(ids) - 1)  # the part before a gap is read apart from the newest tokens
        guessing = not isinstance(self.guesser, NoGuess)
        drafting = Drafting(plan, sampling, generator, self._draft_vocab(ids), self.sampler, guessing, ids)
        # [>=1] tokens: the newest committed one, plus any catch-up
        feed = self._tensor(ids[self.seen :])
        while not drafting.finished:
            room = plan.gamma - drafting.count - 1
            guess = self.guesser.guess(ids, drafting.tokens, room) if guessing else []
            self._draft_forward(feed, guess, drafting)
            if not drafting.ids:  # a row a constraint left empty ended the draft before its first token
                break
            feed = drafting.ids[-1]
        return drafting.draft(self.vocab_size, self.device)

    def _draft_forward(self, feed: torch.Tensor, guess: list[int], drafting: Drafting) -> None:
        """One forward over feed [n] + guess; draft from its rows while the guess matches what was drafted.

        Row j is conditioned on guess[:j], so it is the drafter's own next-token distribution as long
        as every earlier guessed token is the one drafted. The cache keeps only that matching part.
        """
        start, before = clock(self.model), self.cached
        if guess:
            feed_and_guess = torch.cat([feed, self._tensor(guess)])
        else:
            feed_and_guess = feed
        rows = self._next_logits(feed_and_guess.view(1, -1), drafting.vocab, keep=len(guess) + 1)
        used = 0  # rows: [len(guess)+1, width]
        for j in range(len(guess) + 1):
            token = drafting.add(rows[j : j + 1])  # None unless drafting.host; there are guesses only then
            if drafting.finished or j == len(guess) or token != guess[j]:
                used = j
                break
        model_io.crop_to(self.kv, before + feed.shape[0] + used)
        drafting.forwards.append((feed.shape[0] + len(guess), clock(self.model) - start))

    def _draft_vocab(self, ids: list[int]) -> DraftVocab | None:
        if not self.view.vocab_limit or self.view.vocab_limit >= self.width:
            return None
        if self._vocab is None:
            self._vocab = DraftVocab(self.model.get_output_embeddings(), self.view.vocab_limit, self.view.always_ids)
        self._vocab.update(ids)
        return self._vocab

    @torch.inference_mode()
    def _next_logits(self, step_ids: torch.Tensor, vocab: DraftVocab | None, keep: int) -> torch.Tensor:
        """[keep, width] logits of the last `keep` positions, over the whole vocabulary or a DraftVocab."""
        if vocab is None:
            logits = model_io.forward_tensor(self.model, self.kv, step_ids, keep=keep)[:, : self.vocab_size]
            short = self.vocab_size - logits.shape[-1]  # a padded target vocabulary's ids: never drafted
            return torch.nn.functional.pad(logits, (0, short), value=-torch.inf) if short else logits
        return vocab.logits(model_io.hidden_tensor(self.model, self.kv, step_ids, keep))  # [keep, width]


def from_setup(setup: DrafterSetup, _: int | None) -> Drafter:
    """The `model` row's constructor (drafters/registry.py): the pair's drafter model, as loading made its Drafter
    (a ModelDrafter, or a TextDrafter for a drafter of another tokenizer)."""
    if setup.model is None:
        raise DrafterUnusable("model: no drafter model is loaded")
    return setup.model


class Drafting:
    """One draft in progress: its tokens, q rows, confidences, and whether its plan says stop.

    Tokens and confidences stay on the device; with `host`, each is also read back as it is drafted (one read
    per token, for an early end or a prompt-lookup guess)."""

    def __init__(
        self,
        plan: DraftPlan,
        sampling: SamplingConfig,
        generator: torch.Generator,
        vocab: DraftVocab | None,
        sampler: Sampler,
        guessing: bool = False,
        committed: list[int] | None = None,
    ):
        self.plan, self.sampling, self.generator, self.vocab, self.sampler = plan, sampling, generator, vocab, sampler
        self.committed = committed or []  # the ids before the draft: a constraint reads them
        self.vocab_ids: torch.Tensor | None = None  # a DraftVocab row's ids, under a constraint
        self.vocab_width = 0
        self.host = guessing or plan.tracks_confidence or plan.constraint is not None
        self.ids: list[torch.Tensor] = []  # per token: its id, [1] on the device
        self.sure: list[torch.Tensor] = []  # per token: the drafter's q of it, [1] on the device
        self.tokens: list[int] = []  # the same on the host, with `host` only
        self.confidences: list[float] = []  # the same on the host, with `host` only
        self.probs: list[torch.Tensor | None] = []
        self.rows: list[torch.Tensor] = []
        self.forwards: list[tuple[int, float]] = []
        self.path = 1.0  # estimated probability that every token so far is accepted
        self.doubt = False  # a token fell below min_confidence or the path below path_floor

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def finished(self) -> bool:
        return self.doubt or self.count >= self.plan.gamma

    def add(self, logits: torch.Tensor) -> int | None:
        """Draft one token from [1, width] logits; returns its id with `host`, else None (it stays on the device).
        Under a constraint the row is masked as the target's will be; a row it leaves empty ends the draft."""
        if self.plan.constraint is not None:
            logits = self._constrained(logits)
            if not bool(torch.isfinite(logits).any()):
                self.doubt = True
                return None
        # [1], [1, width] or None when greedy
        position, q, chance = chosen(logits, self.sampling, self.generator, self.sampler)
        token = self.vocab.to_ids(position) if self.vocab else position  # [1]
        self.ids.append(token)
        self.sure.append(chance)
        self.probs.append(q)
        self.rows.append(logits)
        if not self.host:
            return None
        (token_id,), (sure,) = read_back(token, self.sure[-1])
        self.tokens.append(int(token_id))
        self.confidences.append(sure)
        if self.plan.tracks_confidence:
            self.path *= min(1.0, self.plan.confidence_scale * sure)
            # a draft the drafter itself doubts is likely rejected: verify what we have
            self.doubt = sure < self.plan.min_confidence or self.path < self.plan.path_floor
        return self.tokens[-1]

    def _constrained(self, logits: torch.Tensor) -> torch.Tensor:
        """[1, width] logits as the plan's constraint leaves them after the committed ids and the draft so far (a
        DraftVocab's rows: their ids' logits, read from a whole-vocabulary row)."""
        assert self.plan.constraint is not None
        context = [self.committed + self.tokens]
        if self.vocab is None:
            return self.plan.constraint.apply(logits, context)
        if self.vocab_ids is None or self.vocab_ids.shape[0] != logits.shape[-1]:  # once a draft: its rows' ids
            self.vocab_ids = self.vocab.to_ids(torch.arange(logits.shape[-1], device=logits.device))
            self.vocab_width = int(self.vocab_ids.max()) + 1
        ids = self.vocab_ids
        whole = torch.full((1, self.vocab_width), float("-inf"), dtype=logits.dtype, device=logits.device)
        whole[0, ids] = logits[0]
        return self.plan.constraint.apply(whole, context)[:, ids]

    def draft(self, vocab_size: int, device: torch.device) -> Draft:
        rows = [q for q in self.probs if q is not None]  # all of them when sampling; none when greedy
        q_probs = torch.cat(rows) if rows and len(rows) == len(self.probs) else None
        if q_probs is not None and self.vocab:
            q_probs = self.vocab.full_width(q_probs, vocab_size)
        tokens = torch.cat(self.ids) if self.ids else torch.empty(0, dtype=torch.long, device=device)
        sure = torch.cat(self.sure) if self.sure else None
        return Draft(tokens, q_probs, self.forwards, self.confidences, sure, DraftRows(self.rows, self.vocab))
