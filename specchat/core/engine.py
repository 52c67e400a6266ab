"""The speculative decoding loop: draft -> verify -> commit -> roll back, as a stream of events.

State between replies: `ids` is the committed sequence (prompt + reply); the target's cache covers
ids[:len(ids)-1] after every step (the newest token is fed next step), and so does the drafter's,
except after a step whose drafts were all accepted, when it lags one more token and catches up
on its next forward. A new prompt that extends `ids` reuses both caches up to the common prefix.
"""
from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specchat.core import kvcache
from specchat.core.adaptive import AutoGamma, DraftPlan
from specchat.config import GAMMA_AUTO, SamplingConfig, SpeculationConfig
from specchat.core.detok import Detokenizer
from specchat.core.drafters import Draft, ModelDrafter
from specchat.core.events import Event, Origin, Rejected, ReplyDone, StepDone, Token
from specchat.core.metrics import StatsRecorder
from specchat.core.sampling import make_generator, probs_from_logits
from specchat.core.verify import Verdict, verify_greedy, verify_sampled


@dataclass
class StepResult:
    tokens: list[int]
    origins: list[Origin]
    rejected: list[int]
    drafted: int
    accepted: int


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Engine:
    def __init__(self, target, tokenizer, drafter: ModelDrafter | None, eos_ids,
                 vocab_size: int | None = None):
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.vocab_size = vocab_size or len(tokenizer)
        self.device = target.get_input_embeddings().weight.device
        self.cache = kvcache.new_cache(target)
        self.ids: list[int] = []
        self.auto = AutoGamma()

    # ----- state -------------------------------------------------------------------------------
    @property
    def target_seen(self) -> int:
        return kvcache.cache_length(self.cache)

    def reset(self) -> None:
        """Forget every cached token (both models)."""
        self.cache = kvcache.new_cache(self.target)
        self.ids = []
        if self.drafter:
            self.drafter.reset()

    def _adopt_prompt(self, prompt_ids: list[int]) -> int:
        """Make `prompt_ids` the committed sequence, keeping cached KV for the common prefix."""
        keep = min(common_prefix_len(self.ids, prompt_ids), len(prompt_ids) - 1)
        kvcache.crop_to(self.cache, min(self.target_seen, keep))
        if self.drafter:
            self.drafter.rollback(keep + 1)
        self.ids = list(prompt_ids)
        return keep

    # ----- the loop ----------------------------------------------------------------------------
    def stream(self, prompt_ids: list[int], sampling: SamplingConfig, speculation: SpeculationConfig,
               cancel: threading.Event | None = None) -> Iterator[Event]:
        """Generate one reply to `prompt_ids`, yielding Token/Rejected/StepDone and a final ReplyDone."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        mode = speculation.mode
        if mode != "target" and self.drafter is None:
            raise ValueError(f"mode '{mode}' needs a drafter model")
        try:
            yield from self._run(list(prompt_ids), sampling, speculation, cancel or threading.Event())
        except BaseException:
            self.reset()  # an interrupted forward may leave caches half-updated
            raise

    def _run(self, prompt_ids, sampling, speculation, cancel) -> Iterator[Event]:
        if self.drafter:
            self.drafter.configure(speculation.drafter_vocab, self.eos_ids, speculation.draft_confidence,
                                   speculation.prompt_lookup)
        reused = self._adopt_prompt(prompt_ids)
        recorder = StatsRecorder(speculation.mode, speculation.gamma, len(prompt_ids), reused)
        seed = sampling.seed if sampling.seed >= 0 else random.randrange(2**63)
        generator = make_generator(seed, self.device)
        detok = Detokenizer(self.tokenizer)
        produced, stop_reason = 0, "max_tokens"
        while produced < sampling.max_new_tokens:
            if cancel.is_set():
                stop_reason = "cancelled"
                break
            remaining = sampling.max_new_tokens - produced
            step = self._step(speculation, sampling, remaining, generator, recorder)
            finished = self._commit(step, remaining)
            produced += len(step.tokens)
            recorder.record_step(step.drafted, step.accepted)
            recorder.record_tokens(len(step.tokens))
            yield from self._step_events(step, detok, final=finished or produced >= sampling.max_new_tokens)
            if finished:
                stop_reason = "eos"
                break
        stats = recorder.finish()
        reply_ids = tuple(self.ids[len(prompt_ids):])
        yield ReplyDone(stats, detok.text, reply_ids, stop_reason)

    def _draft_plan(self, speculation: SpeculationConfig, remaining: int) -> DraftPlan:
        """Auto gamma plans the length and the early end; a fixed gamma drafts gamma tokens."""
        plan = self.auto.plan() if speculation.gamma == GAMMA_AUTO else DraftPlan(speculation.gamma)
        gamma = max(0, min(plan.gamma, remaining - 1))  # never draft past max_new_tokens
        return dataclasses.replace(plan, gamma=gamma)

    def _step(self, speculation, sampling, remaining, generator, recorder) -> StepResult:
        if speculation.mode == "drafter":
            return self._drafter_step(sampling, generator, recorder)
        plan = DraftPlan(0) if speculation.mode == "target" else self._draft_plan(speculation, remaining)
        return self._speculative_step(plan, sampling, generator, recorder, speculation.mode)

    def _drafter_step(self, sampling, generator, recorder) -> StepResult:
        draft = self.drafter.propose(self.ids, 1, sampling, generator)
        self._record_drafter(draft, recorder)
        return StepResult([int(draft.tokens[0])], [Origin.DRAFTER], [], 0, 0)

    def _speculative_step(self, plan, sampling, generator, recorder, mode) -> StepResult:
        draft = self._draft(plan, sampling, generator, recorder)
        drafts = draft.tokens.to(self.device)  # [drafted]; drafted <= gamma (a draft may end early)
        drafted = drafts.shape[0]
        pending = torch.tensor([self.ids[self.target_seen:]], dtype=torch.long, device=self.device)
        feed = torch.cat([pending, drafts.view(1, -1)], dim=1)  # [1, pending + drafted]
        start = time.perf_counter()
        logits = kvcache.forward_tensor(self.target, self.cache, feed, keep=drafted + 1)
        logits = logits[:, :self.vocab_size].to(self.device)  # [drafted+1, vocab]; device_map may end elsewhere
        verdict = self._verify(drafts, draft, logits, sampling, generator)
        seconds = time.perf_counter() - start
        recorder.record_forward("target", seconds, timed=pending.shape[1] == 1)
        if pending.shape[1] == 1:
            self.auto.observe_cost("target", seconds)
        self.auto.observe(drafted, verdict.accepted)
        self.auto.observe_confidences(draft.confidences, verdict.accepted)
        return self._step_result(drafts.tolist(), verdict, drafted, mode)

    def _draft(self, plan: DraftPlan, sampling, generator, recorder) -> Draft:
        if plan.gamma == 0:
            return Draft(torch.empty(0, dtype=torch.long), None, [])
        draft = self.drafter.propose(self.ids, plan.gamma, sampling, generator,
                                     plan.path_floor, plan.confidence_scale)
        self._record_drafter(draft, recorder)
        return draft

    def _record_drafter(self, draft: Draft, recorder: StatsRecorder) -> None:
        for fed, seconds in draft.forwards:
            recorder.record_forward("drafter", seconds, timed=fed <= 2)
            if fed <= 2:
                self.auto.observe_cost("drafter", seconds)

    def _verify(self, drafts, draft: Draft, logits, sampling, generator) -> Verdict:
        if sampling.is_greedy:
            return verify_greedy(drafts, logits)
        p = probs_from_logits(logits, sampling)  # [gamma+1, vocab]
        q = draft.q_probs.to(self.device) if draft.q_probs is not None else p[:0]
        return verify_sampled(drafts, q, p, generator)

    @staticmethod
    def _step_result(drafts: list[int], verdict: Verdict, gamma: int, mode: str) -> StepResult:
        n = verdict.accepted
        if gamma == 0:
            last = Origin.TARGET
        else:
            last = Origin.BONUS if n == gamma else Origin.CORRECTED
        origins = [Origin.DRAFTED] * n + [last]
        return StepResult(drafts[:n] + [verdict.next_token], origins, drafts[n:], gamma, n)

    def _commit(self, step: StepResult, remaining: int) -> bool:
        """Append the step's tokens (cut at EOS and at the token limit); roll caches back. True at EOS."""
        keep = len(step.tokens[:remaining])
        hit_eos = False
        for i, token in enumerate(step.tokens[:keep]):
            if token in self.eos_ids:
                keep, hit_eos = i + 1, True
                break
        if keep < len(step.tokens):
            del step.tokens[keep:], step.origins[keep:]
            step.rejected = [] if hit_eos else step.rejected
        self.ids.extend(step.tokens)
        kvcache.crop_to(self.cache, min(self.target_seen, len(self.ids) - 1))
        if self.drafter:
            self.drafter.rollback(len(self.ids))
        return hit_eos

    def _step_events(self, step: StepResult, detok: Detokenizer, final: bool) -> Iterator[Event]:
        n_accepted = sum(1 for o in step.origins if o == Origin.DRAFTED)
        for i, (token, origin) in enumerate(zip(step.tokens, step.origins)):
            if i == n_accepted and step.rejected:
                yield Rejected(tuple(step.rejected), detok.decode(step.rejected))
            text = detok.push(token)
            if final and i == len(step.tokens) - 1:
                text += detok.flush()
            yield Token(token, text, origin)
        yield StepDone(step.drafted, step.accepted)


def build_engine(pair, with_drafter: bool = True) -> Engine:
    """An Engine (with its own caches) on a loaded pair's models."""
    use_drafter = with_drafter and pair.drafter is not None
    drafter = ModelDrafter(pair.drafter, pair.vocab_size) if use_drafter else None
    return Engine(pair.target, pair.tokenizer, drafter, pair.eos_ids, pair.vocab_size)
