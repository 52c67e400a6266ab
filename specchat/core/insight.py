"""Why a draft was rejected, and each token's p and q: what /why and /trace show.

p is the target's probability of a token and q the drafter's, both under the sampling settings the
rule used (temperature, top-k, top-p). In greedy mode the rule compares argmaxes, not p and q, so
both are then the models' plain softmax (temperature 1), shown for insight, and the acceptance
probability of a draft is 1 when it equals the target's argmax and 0 otherwise.

The cost is one gather per step for the tokens' p, plus two top-5s at a rejected position only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.core.sampling import probs_from_logits

TOP = 5  # tokens of each model shown per rejection

Ranked = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class Rejection:
    """The first draft of a step the target refused, and what each model thought there."""
    step: int                 # the reply's step index (0-based)
    position: int             # the draft position (0 = the first drafted token)
    drafted: int              # the token the drafter proposed
    emitted: int              # the token the target emitted instead
    p: float                  # the target's probability of the drafted token
    q: float                  # the drafter's probability of it
    accept_p: float | None    # min(1, p/q) when sampling; None in greedy (argmax rule)
    target_top: Ranked
    drafter_top: Ranked
    margin: float | None = None  # greedy: the target's logit of its choice minus that of the draft


def accept_probability(p: float, q: float, greedy: bool, accepted: bool) -> float:
    """min(1, p/q) when sampling; in greedy mode 1 for a draft equal to the argmax, else 0."""
    if greedy:
        return 1.0 if accepted else 0.0
    return min(1.0, p / q) if q > 0 else 1.0


def token_probs(logits: torch.Tensor, probs: torch.Tensor | None, tokens: list[int]) -> list[float]:
    """The probability of tokens[i] in row i: from `probs` when sampling, else a softmax of `logits`."""
    rows = len(tokens)
    index = torch.tensor(tokens, dtype=torch.long, device=logits.device).view(-1, 1)
    if probs is not None:
        return probs[:rows].gather(1, index).squeeze(1).tolist()
    scores = logits[:rows].float()
    return torch.exp(scores.gather(1, index).squeeze(1) - torch.logsumexp(scores, dim=-1)).tolist()


def ranked(probs_row: torch.Tensor, ids: torch.Tensor | None = None, k: int = TOP) -> Ranked:
    """The k most likely entries of a [width] probability row; `ids` maps positions to token ids."""
    top = torch.topk(probs_row.float(), min(k, probs_row.shape[-1]))
    positions = top.indices if ids is None else ids[top.indices]
    return tuple(zip(positions.tolist(), top.values.tolist()))


def target_row_probs(logits_row: torch.Tensor, probs_row: torch.Tensor | None) -> torch.Tensor:
    return probs_row if probs_row is not None else torch.softmax(logits_row.float(), dim=-1)


def rejection_at(step: int, position: int, drafted: int, emitted: int, logits: torch.Tensor,
                 probs: torch.Tensor | None, q: float, drafter_top: Ranked) -> Rejection:
    """The record of a rejection at `position`: logits [rows, vocab] of the target's verification
    forward; probs the same rows after the sampling settings (None in greedy mode)."""
    row = target_row_probs(logits[position], None if probs is None else probs[position])
    p = float(row[drafted])
    greedy = probs is None
    margin = float(logits[position].max() - logits[position, drafted]) if greedy else None
    accept_p = None if greedy else accept_probability(p, q, greedy, False)
    return Rejection(step, position, drafted, emitted, p, q, accept_p, ranked(row), drafter_top, margin)


def drafter_ranked(logits_row: torch.Tensor, sampling, ids: torch.Tensor | None) -> Ranked:
    """The drafter's top tokens at one drafted position, from its [1, width] logits row."""
    row = probs_from_logits(logits_row, sampling)[0] if not sampling.is_greedy else \
        torch.softmax(logits_row[0].float(), dim=-1)
    return ranked(row, ids)
