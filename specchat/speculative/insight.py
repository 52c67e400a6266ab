"""Why a draft was rejected, and each token's p and q: what /why and /trace show.

p is the target's probability of a token and q the drafter's, both under the sampling settings the
rule used (temperature, top-k, top-p). In greedy mode the rule compares argmaxes, not p and q, so
both are then the models' plain softmax (temperature 1), shown for insight, and the acceptance
probability of a draft is 1 when it equals the target's argmax and 0 otherwise.

The cost is one gather per step for the tokens' p (read back with the step's verdict), plus two top-5s at a
rejected position only, read back together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.config import SamplingConfig
from specchat.speculative.readback import ints, read_back
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler

TOP = 5  # tokens of each model shown per rejection

Ranked = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class Rejection:
    """The first draft of a step the target refused: what the rule weighed there and what each model thought."""

    step: int  # the reply's step index (0-based)
    position: int  # the draft position (0 = the first drafted token)
    drafted: int  # the token the drafter proposed
    emitted: int  # the token the target emitted instead
    p: float  # the target's probability of the drafted token
    q: float  # the drafter's probability of it
    accept_p: float | None  # min(1, p/q) when sampling; None in greedy (argmax rule)
    margin: float | None  # greedy: the target's logit of its choice minus that of the draft
    target_top: Ranked  # the target's most likely tokens there
    drafter_top: Ranked  # the drafter's
    source: str = ""  # what drafted it: model | lookup | text


def accept_probability(p: float, q: float, greedy: bool, accepted: bool) -> float:
    """min(1, p/q) when sampling; in greedy mode 1 for a draft equal to the argmax, else 0."""
    if greedy:
        return 1.0 if accepted else 0.0
    return min(1.0, p / q) if q > 0 else 1.0


def token_probs(
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    drafts: torch.Tensor,
    accepted: int | torch.Tensor,
    emitted: int | torch.Tensor,
    totals: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device: the probability of each draft in its row [gamma], and of the emitted token in row `accepted`
    [1] (accepted and emitted: ints or 0-dim tensors), from `probs` when sampling, else a softmax of `logits`
    (`totals`: the rows' log-sum-exp [gamma+1] where the caller has it, a GreedyFn's).
    A step's tokens are drafts[:accepted] and then the emitted one."""
    rows = torch.arange(drafts.shape[0], device=logits.device)
    at = torch.as_tensor(accepted, device=logits.device).view(1)
    token = torch.as_tensor(emitted, device=logits.device).view(1)
    if probs is not None:
        return probs[rows, drafts], probs[at, token]
    scores = logits.float()
    total = torch.logsumexp(scores, dim=-1) if totals is None else totals  # [gamma+1]
    return torch.exp(scores[rows, drafts] - total[rows]), torch.exp(scores[at, token] - total[at])


def top(probs_row: torch.Tensor, ids: torch.Tensor | None = None, k: int = TOP) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device: the ids [k] and probabilities [k] of the k most likely entries of a [width] probability row;
    `ids` maps positions to token ids."""
    best = torch.topk(probs_row.float(), min(k, probs_row.shape[-1]))
    return (best.indices if ids is None else ids[best.indices]), best.values


def listed(ids: list[float], probabilities: list[float]) -> Ranked:
    """Read-back ids and probabilities, most likely first, as ((id, probability), ...). Entries of probability 0
    (outside the sampling settings' top-k or top-p) are left out, so a nucleus of 2 tokens lists 2."""
    return tuple((i, p) for i, p in zip(ints(ids), probabilities) if p > 0.0)


def target_row_probs(logits_row: torch.Tensor, probs_row: torch.Tensor | None) -> torch.Tensor:
    return probs_row if probs_row is not None else torch.softmax(logits_row.float(), dim=-1)


def rejection_at(
    step: int,
    position: int,
    drafted: int,
    emitted: int,
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    q: float,
    drafter_best: tuple[torch.Tensor, torch.Tensor] | None,
    source: str = "",
) -> Rejection:
    """The record of a rejection at `position`: logits [rows, vocab] of the target's verification
    forward; probs the same rows after the sampling settings (None in greedy mode); drafter_best the drafter's
    top ids and probabilities there (drafter_top), None for a one-hot q (the drafted token, probability 1).
    Everything is read back in one transfer."""
    row = target_row_probs(logits[position], None if probs is None else probs[position])
    greedy = probs is None
    margin = logits[position].max() - logits[position, drafted] if greedy else 0.0
    best_ids, best_p = drafter_best if drafter_best is not None else (drafted, 1.0)
    p, gap, target_ids, target_p, drafter_ids, drafter_p = read_back(row[drafted], margin, *top(row), best_ids, best_p)
    accept_p = None if greedy else accept_probability(p[0], q, greedy, False)
    margin_read = gap[0] if greedy else None
    tops = listed(target_ids, target_p), listed(drafter_ids, drafter_p)
    return Rejection(step, position, drafted, emitted, p[0], q, accept_p, margin_read, *tops, source)


def drafter_top(
    logits_row: torch.Tensor, sampling: SamplingConfig, ids: torch.Tensor | None, sampler: Sampler = TORCH_SAMPLER
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's top tokens at one drafted position, from its [1, width] logits row (on the device)."""
    row = (
        sampler.probs(logits_row, sampling)[0]
        if not sampling.is_greedy
        else torch.softmax(logits_row[0].float(), dim=-1)
    )
    return top(row, ids)
