"""The speculative decoding loop: plan -> step -> commit -> roll back, as a stream of events.

State between replies: `ids` is the committed sequence (prompt + reply); the target's cache covers
ids[:len(ids)-1] after every step (the newest token is fed next step), and so does the drafter's,
except after a step whose drafts were all accepted, when it lags one more token and catches up
on its next forward. A new prompt that extends `ids` reuses both caches up to the common prefix.

`steps()` yields each StepResult (token ids, origins, rejected drafts) and a final ReplyEnd, with no
text; `stream()` wraps it with detokenized text for the UI (mlx-lm's split).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator

import torch

from specchat.config import Auto, Mode, SamplingConfig, SpeculationConfig, drafter_needed, seed_for_reply
from specchat.memory import release_freed_memory, resident_bytes
from specchat.speculative import model_io
from specchat.speculative.constraint import Constraint, for_drafts
from specchat.speculative.detok import Detokenizer, Tokenizer
from specchat.speculative.drafters.base import CachedDrafter, Drafter, DraftPlan, DraftView
from specchat.speculative.drafters.lookup import common_prefix_len
from specchat.speculative.drafters.registry import DrafterSetup, DrafterUnusable, build
from specchat.speculative.drafters.text import drafter_for
from specchat.speculative.events import Event, Odds, PrefillProgress, Rejected, ReplyDone, ReplyEnd, StepDone, Token
from specchat.speculative.gamma import AutoGamma, GammaPolicy
from specchat.speculative.insight import Rejection, accept_probability, rejection_at
from specchat.speculative.metrics import StatsRecorder
from specchat.speculative.model_io import Model
from specchat.speculative.origin import Origin
from specchat.speculative.pair import Pair
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler, make_generator
from specchat.speculative.step import StepResult, drafter_step, speculative_step
from specchat.speculative.timing import clock

# (bundled w8a8 target, this CPU: 60-80 prompt tok/s at 16-256 tokens a chunk, so 128 costs nothing)


class Engine:
    """Build one with Engine.for_pair (the chat, compare, the API, the bench) or fork() an engine to rerun on
    its models; the constructor is the primitive under both."""

    def __init__(
        self,
        target: Model,
        tokenizer: Tokenizer,
        drafter: CachedDrafter | None,
        eos_ids: Iterable[int],
        vocab_size: int | None = None,
        policy: GammaPolicy | None = None,
        sampler: Sampler = TORCH_SAMPLER,
    ) -> None:
        self.target = target
        self.sampler = sampler  # what computes p and q (sampling.py): chosen where the pair is loaded
        self.tokenizer = tokenizer
        self.model_drafter = drafter  # the drafter model's, which fork() copies (None: no drafter model)
        self.drafter_name: str | None = "model" if drafter is not None else None  # the one that drafts
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.vocab_size = vocab_size or len(tokenizer)
        self.device = model_io.input_device(target)
        self.cache = model_io.new_cache(target)
        self.ids: list[int] = []
        self.policy: GammaPolicy = policy if policy is not None else AutoGamma()
        self.view = drafter.view if drafter is not None else DraftView(always_ids=self.eos_ids)
        self.drafters: dict[str, Drafter] = {}  # by name, each built on first use (drafters/registry.py)

    @classmethod
    def for_pair(cls, pair: Pair, with_drafter: bool = True, policy: GammaPolicy | None = None) -> Engine:
        """An Engine (with its own caches and a fresh gamma policy unless given) on a pair's models (a loaded pair
        is one): the drafter that fits the pair, and the sampler loading chose for it."""
        drafter = None
        if with_drafter and pair.drafter is not None:
            view = DraftView(always_ids=frozenset(int(i) for i in pair.eos_ids))  # the settings' defaults
            drafter = drafter_for(
                pair.drafter, pair.vocab_size, pair.tokenizer, pair.drafter_tokenizer, pair.sampler, view
            )
        return cls(pair.target, pair.tokenizer, drafter, pair.eos_ids, pair.vocab_size, policy, pair.sampler)

    def fork(self) -> Engine:
        """An engine on the same models with caches of its own and a copy of this one's gamma policy."""
        model = self.model_drafter
        return Engine(
            self.target,
            self.tokenizer,
            model.fresh(model.view) if model is not None else None,
            self.eos_ids,
            self.vocab_size,
            copy.deepcopy(self.policy),
            self.sampler,
        )

    def use_policy(self, policy: GammaPolicy) -> None:
        """Plan auto gamma with `policy` from the next step on (a fresh AutoGamma: learn the costs afresh)."""
        self.policy = policy

    @property
    def drafter(self) -> Drafter | None:
        """The drafter that drafts (built by its name on first use); None before any has, with no drafter model."""
        return self._drafter_named(self.drafter_name) if self.drafter_name is not None else None

    @property
    def has_model_drafter(self) -> bool:
        return self.model_drafter is not None

    @property
    def setup(self) -> DrafterSetup:
        """What a drafter kind builds on (drafters/registry.py)."""
        return DrafterSetup(self.target, self.model_drafter, self.vocab_size, self.sampler, self.view)

    def drafter_problem(self, name: str) -> str | None:
        """Why drafter `name` cannot draft here (no kind's name, no drafter model for it, a self:N with N out of
        range); None where it can."""
        try:
            self._drafter_named(name)
        except DrafterUnusable as err:
            return str(err)
        return None

    def _drafter_named(self, name: str) -> Drafter:
        """drafters[name], built on first use by its kind's row (a self:N drafter shares the target's weights)."""
        if name not in self.drafters:
            self.drafters[name] = build(name, self.setup)
        return self.drafters[name]

    def _view_for(self, speculation: SpeculationConfig) -> DraftView:
        """The view the settings ask of a drafter model; drafter mode answers with the drafter's view of everything."""
        context = 0 if speculation.mode == Mode.DRAFTER else speculation.drafter_context
        return DraftView(speculation.drafter_vocab, self.eos_ids, speculation.prompt_lookup, context)

    def _use_view(self, view: DraftView) -> None:
        """Draft with `view` from now on: the drafters are built anew on the same models (their caches too)."""
        if view == self.view:
            return
        self.view, model = view, self.model_drafter
        self.model_drafter = model.fresh(view) if model is not None else None
        self.drafters = {}

    def use_drafter(self, name: str) -> None:
        """Make drafters[name] the one that drafts. It starts from an empty cache: what it cached when
        it last drafted may belong to another conversation."""
        chosen = self._drafter_named(name)
        if chosen is not self.drafter:
            chosen.reset()
            self.drafter_name = name

    # ----- state -------------------------------------------------------------------------------
    @property
    def target_seen(self) -> int:
        return model_io.cache_length(self.cache)

    def reset(self) -> None:
        """Forget every cached token (both models). The gamma policy keeps what it learnt."""
        self.cache = model_io.new_cache(self.target)
        self.ids = []
        built = [*self.drafters.values(), *([self.model_drafter] if self.model_drafter is not None else [])]
        for drafter in {id(d): d for d in built}.values():
            drafter.reset()

    def _adopt_prompt(self, prompt_ids: list[int]) -> int:
        """Make `prompt_ids` the committed sequence, keeping cached KV for the common prefix."""
        keep = min(common_prefix_len(self.ids, prompt_ids), len(prompt_ids) - 1)
        model_io.crop_to(self.cache, min(self.target_seen, keep))
        if self.drafter:
            self.drafter.observe(prompt_ids)  # it keeps what agrees with what it last observed
        self.ids = list(prompt_ids)
        return keep

    # ----- the loop ----------------------------------------------------------------------------
    def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        speculation: SpeculationConfig,
        cancel: threading.Event | None = None,
        constraint: Constraint | None = None,
    ) -> Iterator[Event]:
        """Generate one reply to `prompt_ids`: Token/Rejected/StepDone events and a final ReplyDone; `constraint`
        masks the target's law (constraint.py)."""
        detok = Detokenizer(self.tokenizer)
        for item in self.steps(prompt_ids, sampling, speculation, cancel, constraint):
            if isinstance(item, ReplyEnd):
                yield ReplyDone(item.stats, detok.text, item.ids, item.stop_reason, item.seed)
            elif isinstance(item, PrefillProgress):
                yield item
            else:
                yield from _step_events(item, detok, sampling.is_greedy)

    def steps(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        speculation: SpeculationConfig,
        cancel: threading.Event | None = None,
        constraint: Constraint | None = None,
    ) -> Iterator[PrefillProgress | StepResult | ReplyEnd]:
        """Generate one reply: PrefillProgress while a new prompt is read, committed StepResults (token
        ids, no text) and a final ReplyEnd."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        missing = drafter_needed(self.has_model_drafter, speculation.mode, drafter=speculation.drafter)
        if missing:
            raise ValueError(missing)
        if constraint is not None and speculation.mode == Mode.DRAFTER:
            raise ValueError("a constraint masks the target's law, and drafter mode runs no target")
        wanted = "model" if speculation.mode == Mode.DRAFTER else speculation.drafter
        if speculation.mode != Mode.TARGET:
            self._use_view(self._view_for(speculation))
            self.use_drafter(wanted)  # DrafterUnusable (a ValueError) where it cannot draft here
        try:
            yield from self._run(list(prompt_ids), sampling, speculation, cancel or threading.Event(), constraint)
        except BaseException:
            self.reset()  # an interrupted forward may leave caches half-updated
            raise

    def _run(
        self,
        prompt_ids: list[int],
        sampling: SamplingConfig,
        speculation: SpeculationConfig,
        cancel: threading.Event,
        constraint: Constraint | None = None,
    ) -> Iterator[PrefillProgress | StepResult | ReplyEnd]:
        self._adopt_prompt(prompt_ids)  # the reused tokens: those the leading model's cache still holds
        recorder = StatsRecorder(
            speculation.mode, speculation.gamma, len(prompt_ids), self._prompt_read(speculation.mode)
        )
        recorder.stats.drafter = speculation.drafter if speculation.mode == Mode.SPEC else ""
        seed = seed_for_reply(sampling.seed)
        generator = make_generator(seed, self.device)
        yield from self._prefill(speculation.mode, cancel, recorder)
        produced, stop_reason, index = 0, "max_tokens", 0
        while produced < sampling.max_new_tokens:
            if cancel.is_set():
                stop_reason = "cancelled"
                break
            remaining = sampling.max_new_tokens - produced
            computed = self._step(speculation, sampling, remaining, generator, constraint)
            step, finished = self._commit(computed, remaining, index, sampling)
            index += 1
            produced += len(step.tokens)
            recorder.record(step, kept=len(step.tokens))
            if finished or produced >= sampling.max_new_tokens:
                step = dataclasses.replace(step, place=(step.index, True))
            yield step
            if finished:
                stop_reason = "eos"
                break
        release_freed_memory()  # a prompt's chunks leave freed activations with the heap
        recorder.record_memory(model_io.cache_bytes(self.cache), resident_bytes())
        yield ReplyEnd(recorder.finish(), tuple(self.ids[len(prompt_ids) :]), stop_reason, seed)

    def _prefill(self, mode: Mode, cancel: threading.Event, recorder: StatsRecorder) -> Iterator[PrefillProgress]:
        """Read a new prompt (all but its newest token, which the first step feeds) into the caches of
        the models the mode uses, model_io.PREFILL_CHUNK tokens at a time, with progress after each chunk.
        Cancelling stops between chunks: the caches then hold a prefix of the prompt, which the next
        reply reuses or crops like any other."""
        end, start = len(self.ids) - 1, self._prompt_read(mode)
        began = time.perf_counter()
        chunk = model_io.PREFILL_CHUNK
        chunk_ends = [*range(start + chunk, end, chunk), end] if end > start else []
        for upto in chunk_ends:
            if cancel.is_set():
                break
            if mode != Mode.DRAFTER:
                model_io.forward(self.target, self.cache, self.ids[self.target_seen : upto], keep=1)
            if self.drafter and mode != Mode.TARGET:
                self.drafter.observe(self.ids, read=upto)
            yield PrefillProgress(upto - start, end - start, time.perf_counter() - began)
        drafter_model = self.model_drafter.model if self.model_drafter is not None else None
        recorder.record_prefill(self._prompt_read(mode) - start, clock(self.target, drafter_model) - began)

    def _prompt_read(self, mode: Mode) -> int:
        """Tokens in the cache of the model that leads the mode (the drafter's in drafter mode)."""
        if mode == Mode.DRAFTER:
            return self.drafter.observe(self.ids) if self.drafter is not None else 0
        return self.target_seen

    def _draft_plan(self, speculation: SpeculationConfig, remaining: int) -> DraftPlan:
        """The policy plans auto gamma; a fixed gamma drafts gamma tokens. Copies (the auto and lookup drafters')
        are planned apart, by the policy's copy record, except where the drafter copies alone with a fixed gamma:
        there gamma caps the copy's length. Never past max_new_tokens."""
        if speculation.mode == Mode.TARGET:
            return DraftPlan(0)
        if isinstance(speculation.gamma, Auto):
            plan = self.policy.plan()
        else:
            copies_alone = self.drafter_name == "lookup"
            copy = speculation.gamma if copies_alone or not speculation.gamma else self.policy.copy_length()
            plan = DraftPlan(speculation.gamma, copy=copy)
        gamma = max(0, min(plan.gamma, remaining - 1))
        return dataclasses.replace(
            plan,
            gamma=gamma,
            copy=max(0, min(plan.copy, remaining - 1)),  # only a drafter that copies reads it
            min_confidence=speculation.draft_confidence,
            room=max(0, remaining - 1),
            verified=True,
        )

    def _step(
        self,
        speculation: SpeculationConfig,
        sampling: SamplingConfig,
        remaining: int,
        generator: torch.Generator,
        constraint: Constraint | None = None,
    ) -> StepResult:
        if speculation.mode == Mode.DRAFTER:
            if self.drafter is None:
                raise ValueError(drafter_needed(False, Mode.DRAFTER))
            return drafter_step(self.drafter, self.ids, sampling, generator)
        plan = dataclasses.replace(self._draft_plan(speculation, remaining), constraint=for_drafts(constraint))
        step = speculative_step(
            self.target,
            self.cache,
            self.drafter,
            self.ids,
            plan,
            sampling,
            generator,
            self.vocab_size,
            self.sampler,
            constraint,
        )
        self.policy.observe_step(step)
        return step

    def _commit(
        self, step: StepResult, remaining: int, index: int, sampling: SamplingConfig
    ) -> tuple[StepResult, bool]:
        """Append the step's tokens (cut at EOS and at the token limit); roll caches back. The committed step:
        a copy of `step`, cut likewise, at place `index` of the reply, with /why's record of a refused draft
        (insight.py); and True at EOS."""
        keep = len(step.tokens[:remaining])
        hit_eos = False
        for i, token in enumerate(step.tokens[:keep]):
            if token in self.eos_ids:
                keep, hit_eos = i + 1, True
                break
        laws = dataclasses.replace(step.laws, rejection=self._rejection(step, index, sampling))
        committed = dataclasses.replace(step, place=(index, False), laws=laws)
        if keep < len(step.tokens):
            laws = dataclasses.replace(laws, p=laws.p[:keep], q=laws.q[:keep])
            committed = dataclasses.replace(
                committed, tokens=step.tokens[:keep], origins=step.origins[:keep], laws=laws
            )
            if hit_eos:
                judged = dataclasses.replace(step.judged, rejected=[])
                committed = dataclasses.replace(
                    committed, judged=judged, laws=dataclasses.replace(laws, rejection=None)
                )
        self.ids.extend(committed.tokens)
        model_io.crop_to(self.cache, min(self.target_seen, len(self.ids) - 1))
        if self.drafter:
            self.drafter.observe(self.ids)
        return committed, hit_eos

    def _rejection(self, step: StepResult, index: int, sampling: SamplingConfig) -> Rejection | None:
        """/why's record of the step's first refused draft, from the rows the step kept (insight.py); None when
        every draft was accepted."""
        if step.laws.refused_rows is None or step.draft is None:
            return None
        n, (logits, p) = step.accepted, step.laws.refused_rows
        top = step.draft.top_at(n, sampling, self.sampler)
        q = step.laws.confidences[n]
        return rejection_at(index, n, step.rejected[0], step.tokens[n], logits, p, q, top, step.draft.source)


def _step_events(step: StepResult, detok: Detokenizer, greedy: bool) -> Iterator[Event]:
    """A committed step as events: accepted drafts, the rejected ones, the target's token, each
    token with its p and q (speculative/insight.py)."""
    n_accepted = sum(1 for o in step.origins if o == Origin.DRAFTED)
    for i, (token, origin) in enumerate(zip(step.tokens, step.origins)):
        if i == n_accepted and step.rejected:
            yield Rejected(tuple(step.rejected), detok.decode(step.rejected), step.rejection)
        text = detok.push(token)
        if step.last and i == len(step.tokens) - 1:
            text += detok.flush()  # a tail held back for an incomplete character, now final
        p, q = step.p_tokens[i], step.q_tokens[i]
        drafted = origin == Origin.DRAFTED
        accept_p = accept_probability(p, q, greedy, True) if drafted and p is not None and q is not None else None
        source = step.draft.source if drafted and step.draft is not None else ""
        yield Token(token, text, origin, step.index, i, Odds(p, q, accept_p), source)
    yield StepDone(step.drafted, step.accepted)


def run_to_end(steps: Iterable[object]) -> ReplyEnd | None:
    """Run a reply's steps (Engine.steps) to their end; its ReplyEnd (None where a stand-in engine gave none)."""
    final = None
    for item in steps:
        final = item if isinstance(item, ReplyEnd) else final
    return final
