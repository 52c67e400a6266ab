"""One speculative step as a pure function of the models, their caches and the committed ids.

`speculative_step` drafts with the drafter, scores the pending token plus every draft with one
target forward, and applies the rejection rule. A prompt not yet in the target's cache is fed in a
forward of its own first, so that its rows never share a forward with drafts: with a batch-invariant
target the prompt's cache is then bitwise the same in speculative and target-only decoding. It
returns what happened (tokens, origins, rejected drafts, timings) and leaves committing, cache
rollback and bookkeeping to the Engine, as gpt-fast's `speculative_decode` does. The target's
cache then holds every fed token; the Engine crops it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specchat.config import SamplingConfig
from specchat.speculative import model_io
from specchat.speculative.drafters.base import Draft, Drafter, DraftPlan
from specchat.speculative.insight import Rejection, rejection_at, token_probs
from specchat.speculative.model_io import Cache, Model
from specchat.speculative.origin import Origin
from specchat.speculative.readback import ints, read_back
from specchat.speculative.sampling import NoLawError, ProbsFn, greedy_of, probs_from_logits
from specchat.speculative.timing import clock
from specchat.speculative.verify import Verdict, verify_greedy, verify_sampled

TIMED_DRAFTER_FEED = 2  # a drafter forward over at most this many tokens counts towards c (not a prefill)


@dataclass(frozen=True)
class StepResult:
    """What one step computed. The Engine commits a copy of it (dataclasses.replace): its tokens cut at EOS and
    at the token limit, with its `index` and `last`; the step itself is never edited."""

    tokens: list[int]  # the step's candidates, in order (the Engine's committed copy: cut at EOS / limit)
    origins: list[Origin]
    rejected: list[int]  # drafts the target refused
    drafted: int
    accepted: int
    draft: Draft | None = None  # what the drafter proposed, with its forwards' timings
    target_seconds: float = 0.0  # the verification forward plus verification
    target_fed: int = 0  # tokens the target forward was fed (0: no target forward)
    last: bool = False  # the committed copy's: the reply ends with this step
    index: int = 0  # the committed copy's: the step's place in the reply
    p_tokens: list[float | None] = field(default_factory=list)  # per token: the target's p (insight.py)
    q_tokens: list[float | None] = field(default_factory=list)  # per token: the drafter's q
    rejection: Rejection | None = None  # why the first refused draft was refused (/why)

    @property
    def target_timed(self) -> bool:
        """Only a forward fed one pending token is a decode step; more is (part) prefill."""
        return self.target_fed - self.drafted == 1

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
    probs: ProbsFn = probs_from_logits,
) -> StepResult:
    """Draft up to plan.gamma tokens (a copy: up to plan.copy), verify them with one target forward; the target's cache grows.
    `probs` computes the target's p (the drafter's q: plan.probs, the engine gives both the same)."""
    if plan.gamma and drafter is None:
        raise ValueError("a step that drafts needs a drafter")
    draft = drafter.propose(ids, plan, sampling, generator) if plan.drafts and drafter is not None else empty_draft()
    device = model_io.input_device(target)
    drafts = draft.tokens.to(device)  # [drafted]; drafted <= gamma (a draft may end early)
    drafted = drafts.shape[0]
    pending = torch.tensor([ids[model_io.cache_length(cache) :]], dtype=torch.long, device=device)
    start = clock(target)
    if pending.shape[1] > 1:  # the prompt alone first: the same forward whether drafts follow or not
        model_io.forward_tensor(target, cache, pending[:, :-1], keep=1)
    feed = torch.cat([pending[:, -1:], drafts.view(1, -1)], dim=1)  # [1, 1 + drafted]
    logits = model_io.forward_tensor(target, cache, feed, keep=drafted + 1)
    logits = logits[:, :vocab_size].to(device)  # [drafted+1, vocab]; device_map may end elsewhere
    verdict, p, totals = _verify(drafts, draft, logits, sampling, generator, probs)
    p_drafts_on_device, p_emitted_on_device = token_probs(
        logits, p, drafts, verdict.accepted, verdict.next_token, totals
    )
    unread = draft.sure if draft.sure is not None and len(draft.confidences) < drafted else drafts[:0]
    # the step's one read: what the rule decided, the drafts, each token's p and the drafter's q
    accepted, emitted, drafted_ids, p_drafts, p_emitted, sure = read_back(
        verdict.accepted, verdict.next_token, drafts, p_drafts_on_device, p_emitted_on_device, unread
    )
    seconds = clock(target) - start
    if any(math.isnan(value) for value in p_emitted):  # greedy too: NaN logits' argmax is no token either
        raise NoLawError()  # the emitted token's p is NaN where the target's law is: read with the rest, no extra read
    if len(sure):
        draft.confidences = sure
    read = Verdict(int(accepted[0]), int(emitted[0]))
    p_tokens: list[float | None] = [*p_drafts[: read.accepted], *p_emitted]
    return _result(
        ints(drafted_ids), read, draft, seconds, pending.shape[1] + drafted, p_tokens, logits, p, sampling, probs
    )


def drafter_step(
    drafter: Drafter,
    ids: list[int],
    sampling: SamplingConfig,
    generator: torch.Generator,
    probs: ProbsFn = probs_from_logits,
) -> StepResult:
    """Drafter-only decoding: one token from the drafter, no target forward; one read."""
    draft = drafter.propose(ids, DraftPlan(1, probs=probs), sampling, generator)
    unread = draft.sure[:1] if draft.sure is not None and not draft.confidences else draft.tokens[:0]
    (token,), sure = read_back(draft.tokens[:1], unread)
    if len(sure):
        draft.confidences = sure
    q_tokens: list[float | None] = [*draft.confidences[:1]]
    return StepResult([int(token)], [Origin.DRAFTER], [], 0, 0, draft, p_tokens=[None], q_tokens=q_tokens)


def _verify(
    drafts: torch.Tensor,
    draft: Draft,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    probs: ProbsFn,
) -> tuple[Verdict, torch.Tensor | None, torch.Tensor | None]:
    """The verdict; the target's probabilities it used (None in greedy mode); in greedy mode the rows' log-sum-exp,
    computed with their argmax in one go (greedy_of(probs)), else None."""
    if sampling.is_greedy:
        choice, totals = greedy_of(probs)(logits)
        return verify_greedy(drafts, logits, choice), None, totals
    p = probs(logits, sampling)  # [gamma+1, vocab]
    q = draft.q_probs.to(logits.device) if draft.q_probs is not None else p[:0]
    return verify_sampled(drafts, q, p, generator), p, None


def _result(
    drafts: list[int],
    verdict: Verdict,
    draft: Draft,
    seconds: float,
    fed: int,
    p_tokens: list[float | None],
    logits: torch.Tensor,
    p: torch.Tensor | None,
    sampling: SamplingConfig,
    probs: ProbsFn,
) -> StepResult:
    """The step's record from its read-back verdict: tokens and origins, each token's q, and the rejection's
    record when a draft was refused (insight.py); p is read already."""
    n, gamma, emitted = int(verdict.accepted), len(drafts), int(verdict.next_token)
    if gamma == 0:
        last = Origin.TARGET
    else:
        last = Origin.BONUS if n == gamma else Origin.CORRECTED
    q_tokens: list[float | None] = [*draft.confidences[:n], None]
    rejection = None
    if n < gamma:
        rejection = rejection_at(
            -1, n, drafts[n], emitted, logits, p, draft.confidences[n], draft.top_at(n, sampling, probs), draft.source
        )
    return StepResult(
        drafts[:n] + [emitted],
        [Origin.DRAFTED] * n + [last],
        drafts[n:],
        gamma,
        n,
        draft,
        seconds,
        fed,
        p_tokens=p_tokens,
        q_tokens=q_tokens,
        rejection=rejection,
    )
