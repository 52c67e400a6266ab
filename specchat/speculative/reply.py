"""One reply's loop: adopt the prompt and read it, then plan, step and commit until EOS, the token limit or a
cancel; the committed StepResults (token ids, no text) and a final ReplyEnd."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Protocol

import torch

from specchat.config import Auto, Mode, SamplingConfig, SpeculationConfig, seed_for_reply
from specchat.memory import release_freed_memory, resident_bytes
from specchat.speculative import model_io
from specchat.speculative.commit import committed, refusal_record
from specchat.speculative.constraint import Constraint, for_drafts
from specchat.speculative.conversation import Conversation
from specchat.speculative.drafter_set import DrafterSet
from specchat.speculative.drafters.base import DraftPlan
from specchat.speculative.drafters.mixed import MixedDrafter
from specchat.speculative.drafters.registry import drafter_needed
from specchat.speculative.events import PrefillProgress, ReplyEnd
from specchat.speculative.gamma import GammaPolicy
from specchat.speculative.metrics import StatsRecorder
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import Sampler, make_generator
from specchat.speculative.step import StepResult, drafter_step, speculative_step
from specchat.speculative.timing import clock

Item = PrefillProgress | StepResult | ReplyEnd


class Parts(Protocol):
    """What a reply runs on: the Engine's parts."""

    target: Model
    vocab_size: int
    eos_ids: frozenset[int]
    sampler: Sampler
    device: torch.device
    policy: GammaPolicy
    drafters: DrafterSet
    conversation: Conversation


def run_reply(
    parts: Parts,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    speculation: SpeculationConfig,
    cancel: threading.Event,
    constraint: Constraint | None,
) -> Iterator[Item]:
    chat, drafter, mode = parts.conversation, parts.drafters.current, speculation.mode
    chat.adopt(prompt_ids, drafter)  # the reused tokens: those the leading model's cache still holds
    start = chat.prompt_read(mode, drafter)
    recorder = StatsRecorder(mode, speculation.gamma, len(prompt_ids), start)
    recorder.stats.drafter = speculation.drafter if mode == Mode.SPEC else ""
    seed = seed_for_reply(sampling.seed)
    generator = make_generator(seed, parts.device)
    began = time.perf_counter()
    yield from chat.read_prompt(mode, drafter, cancel)
    drafter_model = parts.drafters.model.model if parts.drafters.model is not None else None
    recorder.record_prefill(chat.prompt_read(mode, drafter) - start, clock(parts.target, drafter_model) - began)
    produced, stop_reason, index = 0, "max_tokens", 0
    while produced < sampling.max_new_tokens:
        if cancel.is_set():
            stop_reason = "cancelled"
            break
        remaining = sampling.max_new_tokens - produced
        computed = _step(parts, speculation, sampling, remaining, generator, constraint)
        why = refusal_record(computed, index, sampling, parts.sampler)
        step, finished = committed(computed, remaining, index, parts.eos_ids, why)
        chat.append(step.tokens, drafter, step.target_rows)
        index, produced = index + 1, produced + len(step.tokens)
        recorder.record(step, kept=len(step.tokens))
        if finished or produced >= sampling.max_new_tokens:
            step = dataclasses.replace(step, last=True)
        yield step
        if finished:
            stop_reason = "eos"
            break
    release_freed_memory()  # a prompt's chunks leave freed activations with the heap
    recorder.record_memory(model_io.kv_bytes(chat.kv), resident_bytes())
    yield ReplyEnd(recorder.finish(), tuple(chat.ids[len(prompt_ids) :]), stop_reason, seed)


def _step(
    parts: Parts,
    speculation: SpeculationConfig,
    sampling: SamplingConfig,
    remaining: int,
    generator: torch.Generator,
    constraint: Constraint | None,
) -> StepResult:
    drafter, ids = parts.drafters.current, parts.conversation.ids
    if speculation.mode == Mode.DRAFTER:
        if drafter is None:
            raise ValueError(drafter_needed(False, Mode.DRAFTER))
        return drafter_step(drafter, ids, sampling, generator)
    copies_only = isinstance(drafter, MixedDrafter) and drafter.drafter is None  # lookup, or auto with no model
    plan = draft_plan(parts.policy, speculation, remaining, parts.drafters.name == "lookup", not copies_only)
    plan = dataclasses.replace(plan, constraint=for_drafts(constraint))
    step = speculative_step(
        parts.target,
        parts.conversation.kv,
        drafter,
        ids,
        plan,
        sampling,
        generator,
        parts.vocab_size,
        parts.sampler,
        constraint,
    )
    parts.policy.observe_step(step)
    return step


def draft_plan(
    policy: GammaPolicy, speculation: SpeculationConfig, remaining: int, copies_alone: bool, model: bool = True
) -> DraftPlan:
    """The policy plans auto gamma; a fixed gamma drafts gamma tokens. Copies (the auto and lookup drafters') are
    planned apart, by the policy's copy record, against the drafter's own draft where it drafts one (`model`), else
    against a target-only step; where the drafter is `lookup` (`copies_alone`) with a fixed gamma, gamma caps the
    copy's length. Never past max_new_tokens."""
    if speculation.mode == Mode.TARGET:
        return DraftPlan(0)
    model = model and not copies_alone
    if isinstance(speculation.gamma, Auto):
        plan = policy.plan(model=model)
    else:
        against = speculation.gamma if model else 0
        copy = speculation.gamma if copies_alone or not speculation.gamma else policy.copy_length(against)
        plan = DraftPlan(speculation.gamma, copy=copy)
    return dataclasses.replace(
        plan,
        gamma=max(0, min(plan.gamma, remaining - 1)),
        copy=max(0, min(plan.copy, remaining - 1)),  # only a drafter that copies reads it
        min_confidence=speculation.draft_confidence,
        room=max(0, remaining - 1),
        verified=True,
    )
