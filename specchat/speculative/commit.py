"""Committing a step: its tokens cut at EOS and at the token limit, its place in the reply, and /why's record of
its first refused draft (insight.py). The step the rule computed is never edited: the committed one is a copy."""

from __future__ import annotations

import dataclasses

from specchat.config import SamplingConfig
from specchat.speculative.insight import Rejection, rejection_at
from specchat.speculative.sampling import Sampler
from specchat.speculative.step import StepResult


def committed(
    step: StepResult, remaining: int, index: int, eos_ids: frozenset[int], why: Rejection | None
) -> tuple[StepResult, bool]:
    """The copy of `step` the reply keeps: cut at its first EOS and to `remaining` tokens, at place `index`, with
    /why's record `why`; and True where it ends at EOS (a reply cut there refused nothing)."""
    keep = len(step.tokens[:remaining])
    at_eos = next((i for i, token in enumerate(step.tokens[:keep]) if token in eos_ids), None)
    keep = keep if at_eos is None else at_eos + 1
    kept = dataclasses.replace(
        step,
        tokens=step.tokens[:keep],
        origins=step.origins[:keep],
        odds=step.odds[:keep],
        index=index,
        rejection=why,
    )
    if at_eos is not None and keep < len(step.tokens):
        kept = dataclasses.replace(kept, rejected=[], rejection=None)
    return kept, at_eos is not None


def refusal_record(step: StepResult, index: int, sampling: SamplingConfig, sampler: Sampler) -> Rejection | None:
    """/why's record of the step's first refused draft, from the rows the step kept (insight.py); None when every
    draft was accepted."""
    if step.refused_rows is None or step.draft is None:
        return None
    n, (logits, p) = step.accepted, step.refused_rows
    top = step.draft.top_at(n, sampling, sampler)
    q = step.confidences[n]
    return rejection_at(index, n, step.rejected[0], step.tokens[n], logits, p, q, top, step.draft.source)
