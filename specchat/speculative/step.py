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
from specchat.speculative.insight import Rejection, token_probs
from specchat.speculative.model_io import Cache, Model
from specchat.speculative.origin import Origin
from specchat.speculative.readback import ints, read_back
from specchat.speculative.sampling import TORCH_SAMPLER, NoLawError, Sampler, penalize
from specchat.speculative.timing import clock
from specchat.speculative.verify import Verdict, verify_greedy, verify_sampled

TIMED_DRAFTER_FEED = 2  # a drafter forward over at most this many tokens counts towards c (not a prefill)


@dataclass(frozen=True)
class Judged:
    """A step's drafts as the target judged them."""

    count: int = 0  # drafted
    accepted: int = 0
    rejected: list[int] = field(default_factory=list)  # the drafts it refused (none where the reply ended first)


@dataclass(frozen=True)
class TargetCost:
    seconds: float = 0.0  # the verification forward plus verification
    fed: int = 0  # tokens the target forward was fed (0: no target forward)


@dataclass(frozen=True)
class TokenLaws:
    """Per token, the target's p and the drafter's q; the drafter's q of every drafted token (read back with the
    verdict); at the first refused draft, the target's logits and p rows, from which the Engine builds /why's record
    (insight.rejection_at), and then that record."""

    p: list[float | None] = field(default_factory=list)
    q: list[float | None] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    refused_rows: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (logits, p or None when greedy)
    rejection: Rejection | None = None  # the Engine's, on its committed copy


@dataclass(frozen=True)
class StepResult:
    """What one step computed. The Engine commits a copy of it (dataclasses.replace): its tokens cut at EOS and
    at the token limit, with its place in the reply; the step itself is never edited."""

    tokens: list[int]  # the step's candidates, in order (the Engine's committed copy: cut at EOS / limit)
    origins: list[Origin]
    judged: Judged = Judged()
    draft: Draft | None = None  # what the drafter proposed, with its forwards' timings
    cost: TargetCost = TargetCost()
    laws: TokenLaws = TokenLaws()
    place: tuple[int, bool] = (0, False)  # the committed copy's: its index in the reply, and whether it is the last

    drafted = property(lambda self: self.judged.count)
    accepted = property(lambda self: self.judged.accepted)
    rejected = property(lambda self: self.judged.rejected)
    target_seconds = property(lambda self: self.cost.seconds)
    target_fed = property(lambda self: self.cost.fed)
    p_tokens = property(lambda self: self.laws.p)
    q_tokens = property(lambda self: self.laws.q)
    rejection = property(lambda self: self.laws.rejection)
    index = property(lambda self: self.place[0])
    last = property(lambda self: self.place[1])

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
    cache: Cache,
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
    refused = (logits, p) if n < gamma else None
    laws = TokenLaws(p_tokens, [*confidences[:n], None], confidences, refused)
    tokens = ints(drafted)[:n] + [int(emitted[0])]
    origins = [Origin.DRAFTED] * n + [_last_origin(n, gamma)]
    return StepResult(tokens, origins, Judged(gamma, n, ints(drafted)[n:]), draft, TargetCost(seconds, fed), laws)


def drafter_step(drafter: Drafter, ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> StepResult:
    """Drafter-only decoding: one token from the drafter, no target forward; one read."""
    draft = drafter.propose(ids, DraftPlan(1), sampling, generator)
    unread = draft.sure[:1] if draft.sure is not None and not draft.confidences else draft.tokens[:0]
    (token,), sure = read_back(draft.tokens[:1], unread)
    confidences = sure or draft.confidences
    laws = TokenLaws([None], [*confidences[:1]], confidences)
    return StepResult([int(token)], [Origin.DRAFTER], draft=draft, laws=laws)


def _score(
    target: Model, cache: Cache, ids: list[int], drafts: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, int]:
    """The target's logits [drafted+1, vocab] for the pending token and each draft, and how many tokens it was fed:
    a prompt's tokens not yet in the cache first, in a forward of their own (the same whether drafts follow or not)."""
    device = model_io.input_device(target)
    pending = torch.tensor([ids[model_io.cache_length(cache) :]], dtype=torch.long, device=device)
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
