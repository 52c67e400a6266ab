"""One speculative step as a pure function of the models, their caches and the committed ids.

`speculative_step` drafts with the drafter, scores the pending token plus every draft with one
target forward, and applies the rejection rule. A prompt not yet in the target's cache is fed in a
forward of its own first, so that its rows never share a forward with drafts: with a batch-invariant
target the prompt's cache is then bitwise the same in speculative and target-only decoding. It
returns what happened (tokens, origins, the drafts as judged, timings, each token's p and q) and writes
into none of its arguments but the target's cache; committing, cache rollback, bookkeeping and /why's
record (insight.py) are the Engine's, as gpt-fast's `speculative_decode` leaves them to its caller.
The target's cache then holds every fed token; the Engine crops it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specchat.config import SamplingConfig
from specchat.speculative import model_io
from specchat.speculative.constraint import Constraint, constrain
from specchat.speculative.drafters.base import Draft, Drafter, DraftPlan
from specchat.speculative.insight import Rejection, accept_probability, token_probs
from specchat.speculative.model_io import KVCache, Model
from specchat.speculative.origin import Origin
from specchat.speculative.readback import ints, read_back
from specchat.speculative.sampling import TORCH_SAMPLER, NoLawError, Sampler, penalize
from specchat.speculative.timing import clock
from specchat.speculative.verify import Verdict, verify_greedy, verify_sampled

TIMED_DRAFTER_FEED = 2  # a drafter forward over at most this many tokens counts towards c (not a prefill)


@dataclass(frozen=True)
class Odds:
    """One token's figures (speculative/insight.py says under what law). A step yields one per token; committing
    cuts them with the tokens and each Token event carries its own, so a new per-token figure is a field here and
    the line of `token_odds` that computes it."""

    p: float | None = None  # the target's probability of the token
    q: float | None = None  # the drafter's, for drafted tokens
    accept_p: float | None = None  # a drafted token's acceptance probability, min(1, p/q); greedy: 1


def token_odds(p: list[float | None], q: list[float | None], drafted: int, greedy: bool) -> list[Odds]:
    """Each token's Odds from its p and q (the first `drafted` tokens are accepted drafts)."""
    odds = []
    for i, (p_i, q_i) in enumerate(zip(p, q)):
        accept_p = (
            accept_probability(p_i, q_i, greedy, True) if i < drafted and p_i is not None and q_i is not None else None
        )
        odds.append(Odds(p_i, q_i, accept_p))
    return odds


@dataclass(frozen=True)
class StepResult:
    """What one step computed. The Engine commits a copy of it (dataclasses.replace): its tokens and their odds cut
    at EOS and at the token limit, with its place in the reply and /why's record; the step itself is never edited."""

    tokens: list[int]  # the step's candidates, in order (the committed copy: cut at EOS / limit)
    origins: list[Origin]
    odds: list[Odds] = field(default_factory=list)  # per token
    drafted: int = 0
    accepted: int = 0
    rejected: list[int] = field(default_factory=list)  # the drafts it refused (none where the reply ended first)
    draft: Draft | None = None  # what the drafter proposed, with its forwards' timings
    target_seconds: float = 0.0  # the verification forward plus verification
    target_fed: int = 0  # tokens the target forward was fed (0: no target forward)
    confidences: list[float] = field(default_factory=list)  # the drafter's q of every drafted token
    refused_rows: tuple[torch.Tensor, torch.Tensor | None] | None = None  # at the first refused draft: (logits, p)
    rejection: Rejection | None = None  # /why's record of it (insight.rejection_at), on the committed copy
    target_rows: torch.Tensor | None = None  # the verification forward's hidden states, a row a token fed (features)
    index: int = 0  # the committed copy's place in the reply
    last: bool = False  # whether it is the reply's last step

    @property
    def target_timed(self) -> bool:
        """Only a forward fed one pending token is a decode step; more is (part) prefill."""
        return bool(self.target_fed - self.drafted == 1)

    def drafter_forwards(self) -> list[tuple[float, bool]]:
        """(seconds, timed) per drafter forward; timed ones are decode steps, not prefill."""
        forwards = self.draft.forwards if self.draft else []
        return [(seconds, fed <= TIMED_DRAFTER_FEED) for fed, seconds in forwards]


def empty_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long), None, [])


def speculative_step(
    target: Model,
    cache: KVCache,
    drafter: Drafter | None,
    ids: list[int],
    plan: DraftPlan,
    sampling: SamplingConfig,
    generator: torch.Generator,
    vocab_size: int,
    sampler: Sampler = TORCH_SAMPLER,
    constraint: Constraint | None = None,
) -> StepResult:
    """Draft up to plan.gamma tokens (a copy: up to plan.copy), verify them with one target forward, read back once;
    the target's cache grows. `sampler` computes the target's p (the drafter's q: the drafter's own, the same);
    `constraint` masks the target's logits (constraint.py)."""
    if plan.gamma and drafter is None:
        raise ValueError("a step that drafts needs a drafter")
    draft = drafter.propose(ids, plan, sampling, generator) if plan.drafts and drafter is not None else empty_draft()
    drafts = draft.tokens.to(model_io.input_device(target))  # [drafted]; drafted <= gamma (a draft may end early)
    start = clock(target)
    logits, fed = _score(target, cache, ids, drafts, vocab_size)
    target_rows = model_io.features(cache)  # the rows the forward kept, where the target keeps them (a draft head's)
    if sampling.penalized or constraint is not None:  # each row for what came before its token: the context, then
        drafted_ids = [int(token) for token in drafts.tolist()]  # the drafts before it; one read, only where needed
        contexts = [ids + drafted_ids[:row] for row in range(len(drafted_ids) + 1)]
        logits = constrain(penalize(logits, contexts, sampling), constraint, contexts)
    verdict, p, totals = _verdict(drafts, draft, logits, sampling, generator, sampler)
    p_drafts, p_emitted = token_probs(logits, p, drafts, verdict.accepted, verdict.next_token, totals)
    unread = draft.sure if draft.sure is not None and len(draft.confidences) < drafts.shape[0] else drafts[:0]
    # the step's one read: what the rule decided, the drafts, each token's p and the drafter's q
    accepted, emitted, drafted, p_drafts_read, p_emitted_read, sure = read_back(
        verdict.accepted, verdict.next_token, drafts, p_drafts, p_emitted, unread
    )
    seconds = clock(target) - start
    if any(math.isnan(value) for value in p_emitted_read):  # greedy too: NaN logits' argmax is no token either
        raise NoLawError()  # the emitted token's p is NaN where the target's law is: read with the rest, no extra read
    n, gamma, confidences = int(accepted[0]), len(drafted), sure or draft.confidences
    p_tokens: list[float | None] = [*p_drafts_read[:n], *p_emitted_read]
    odds = token_odds(p_tokens, [*confidences[:n], None], n, sampling.is_greedy)
    return StepResult(
        ints(drafted)[:n] + [int(emitted[0])],
        [Origin.DRAFTED] * n + [_last_origin(n, gamma)],
        odds,
        drafted=gamma,
        accepted=n,
        rejected=ints(drafted)[n:],
        draft=draft,
        target_seconds=seconds,
        target_fed=fed,
        confidences=confidences,
        refused_rows=(logits, p) if n < gamma else None,
        target_rows=target_rows,
    )


def drafter_step(drafter: Drafter, ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> StepResult:
    """Drafter-only decoding: one token from the drafter, no target forward; one read."""
    draft = drafter.propose(ids, DraftPlan(1), sampling, generator)
    unread = draft.sure[:1] if draft.sure is not None and not draft.confidences else draft.tokens[:0]
    (token,), sure = read_back(draft.tokens[:1], unread)
    confidences = sure or draft.confidences
    odds = [Odds(None, confidences[0] if confidences else None)]
    return StepResult([int(token)], [Origin.DRAFTER], odds, draft=draft, confidences=confidences)


def _score(
    target: Model, cache: KVCache, ids: list[int], drafts: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, int]:
    """The target's logits [drafted+1, vocab] for the pending token and each draft, and how many tokens it was fed:
    a prompt's tokens not yet in the cache first, in a forward of their own (the same whether drafts follow or not)."""
    device = model_io.input_device(target)
    pending = torch.tensor([ids[model_io.kv_length(cache) :]], dtype=torch.long, device=device)
    if pending.shape[1] > 1:
        model_io.forward_tensor(target, cache, pending[:, :-1], keep=1)
    feed = torch.cat([pending[:, -1:], drafts.view(1, -1)], dim=1)  # [1, 1 + drafted]
    logits = model_io.forward_tensor(target, cache, feed, keep=drafts.shape[0] + 1)
    return logits[:, :vocab_size].to(device), pending.shape[1] + drafts.shape[0]  # device_map may end elsewhere


def _verdict(
    drafts: torch.Tensor,
    draft: Draft,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    sampler: Sampler,
) -> tuple[Verdict, torch.Tensor | None, torch.Tensor | None]:
    """The verdict; the target's probabilities it used (None in greedy mode); in greedy mode the rows' log-sum-exp,
    computed with their argmax in one go (the sampler's greedy rows), else None."""
    if sampling.is_greedy:
        choice, totals = sampler.greedy(logits)
        return verify_greedy(drafts, logits, choice), None, totals
    p = sampler.probs(logits, sampling)  # [gamma+1, vocab]
    q = draft.q_probs.to(logits.device) if draft.q_probs is not None else p[:0]
    return verify_sampled(drafts, q, p, generator), p, None


def _last_origin(accepted: int, drafted: int) -> Origin:
    """Who wrote a step's last token: the target alone, after every draft (a bonus), or in place of a refused one."""
    if drafted == 0:
        return Origin.TARGET
    return Origin.BONUS if accepted == drafted else Origin.CORRECTED
