"""Comparison mode: rerun a reply target-only (and drafter-only) with the same prompt, seed and sampling.

The reruns use engines of their own (own KV caches on the same loaded models), so the chat's history
and caches are never disturbed; each rerun engine reuses its own cache across turns like the chat's.
The first rerun after compare is turned on reads the whole conversation: the speedup compares the
generation rates only (ReplyStats.generation_tokens_per_s) and each side's prompt reading is shown apart.
A greedy difference is explained: the first differing position and the target's top-2 logit margin
there, so a near tie in low precision can be told from a bug.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specchat.config import Mode
from specchat.session.stop_strings import STOP_STRING
from specchat.speculative import model_io
from specchat.speculative.engine import Engine, run_to_end
from specchat.speculative.events import ReplyDone, Token
from specchat.speculative.metrics import ReplyStats

NEAR_TIE = 0.05  # the least margin called a near tie (float32 logits)
TIE_ULPS = 2  # and at least this many units in the last place of the logits' dtype at the top logit


def tie_threshold(top_logit: float, dtype: torch.dtype) -> float:
    """The top-2 logit margin below which rounding in `dtype` can flip the argmax: bf16 holds a logit
    near 20 only to 0.125, so its threshold there is 0.25; float32's stays at NEAR_TIE."""
    magnitude = 2.0 ** math.floor(math.log2(abs(top_logit))) if top_logit else 1.0
    return max(NEAR_TIE, TIE_ULPS * torch.finfo(dtype).eps * magnitude)


@dataclass(frozen=True)
class Run:
    label: str  # the chat's reply: its mode (a Mode's text); a rerun: "target-only" | "drafter-only"
    text: str
    ids: tuple[int, ...]
    stats: ReplyStats
    tokens: tuple[Token, ...] = ()  # the chat's reply's, with who wrote each (the compare view colours them)


@dataclass(frozen=True)
class Divergence:
    position: int  # index in the reply of the first differing token
    spec_token: str
    other_token: str
    margin: float  # target's top-1 minus top-2 logit at that position
    tie_below: float = NEAR_TIE  # margins below this are near ties in the logits' dtype

    @property
    def near_tie(self) -> bool:
        return self.margin < self.tie_below


@dataclass(frozen=True)
class CompareReport:
    spec: Run
    others: tuple[Run, ...]
    greedy: bool
    divergence: Divergence | None  # only for greedy runs whose target-only text differs

    @property
    def target(self) -> Run:
        return self.others[0]

    @property
    def identical(self) -> bool:
        return self.spec.ids == self.target.ids

    @property
    def speedup(self) -> float:
        """Generation against generation: each side's prompt reading is left out (the rerun may have read the
        whole conversation while the reply reused its cache), so both sides measure the same work."""
        base = self.target.stats.generation_tokens_per_s
        return self.spec.stats.generation_tokens_per_s / base if base else 0.0

    @property
    def saved_s(self) -> float:
        """Seconds speculation saved on this reply (negative: what it cost): the reply's tokens at the target-only
        run's generation rate, less the reply's own generation time."""
        base = self.target.stats.generation_tokens_per_s
        spec = self.spec.stats
        return spec.new_tokens / base - spec.generation_s if base else 0.0


class Comparer:
    """The compare_fn a ChatSession calls after each reply when compare mode is on."""

    def __init__(self, pair):
        self.target = pair.target
        self.tokenizer = pair.tokenizer
        self.target_engine = Engine.for_pair(pair, with_drafter=False)
        self.drafter_engine = Engine.for_pair(pair) if pair.drafter is not None else None

    def __call__(
        self, session, prompt_ids: list[int], done: ReplyDone, cancel: threading.Event
    ) -> Iterator[CompareReport]:
        cfg = session.config
        sampling = dataclasses.replace(session.sampling_for(prompt_ids), seed=done.seed)  # the reply's seed and cap
        runs = [self._rerun(self.target_engine, Mode.TARGET, prompt_ids, cfg, sampling, cancel)]
        if cfg.speculation.compare == "drafter" and self.drafter_engine is not None:
            runs.append(self._rerun(self.drafter_engine, Mode.DRAFTER, prompt_ids, cfg, sampling, cancel))
        if any(r is None for r in runs):
            return  # cancelled during a rerun: nothing fair to show
        if done.stop_reason == STOP_STRING:  # the reply was cut there; the reruns were not
            runs = [self._clipped(run, len(done.ids)) for run in runs]
        tokens = tuple(session.records[-1].tokens) if session.records else ()
        spec = Run(str(cfg.speculation.mode), done.text, done.ids, done.stats, tokens)
        greedy = cfg.sampling.is_greedy
        divergence = None
        if greedy and spec.ids != runs[0].ids:
            divergence = self.explain(prompt_ids, spec.ids, runs[0].ids)
        yield CompareReport(spec, tuple(runs), greedy, divergence)

    def _rerun(self, engine: Engine, mode: Mode, prompt_ids, cfg, sampling, cancel) -> Run | None:
        """The same prompt on a rerun engine's own caches, token ids only; the text is decoded once."""
        speculation = dataclasses.replace(cfg.speculation, mode=mode)
        final = run_to_end(engine.steps(prompt_ids, sampling, speculation, cancel))
        if final is None or final.stop_reason == "cancelled":
            return None
        text = self.tokenizer.decode(list(final.ids), skip_special_tokens=True)
        return Run(f"{mode}-only", text, final.ids, final.stats)

    def _clipped(self, run: Run, length: int) -> Run:
        """`run` as far as the chat's reply went (its stats stay those of the whole rerun)."""
        ids = run.ids[:length]
        return Run(run.label, self.tokenizer.decode(list(ids), skip_special_tokens=True), ids, run.stats)

    def explain(self, prompt_ids: list[int], a: tuple[int, ...], b: tuple[int, ...]) -> Divergence:
        position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        context = list(prompt_ids) + list(a[:position])
        logits = model_io.forward(self.target, model_io.new_kv_cache(self.target), context, keep=1)[0]
        top2 = torch.topk(logits.float(), 2).values.tolist()
        return Divergence(
            position,
            self._piece(a, position),
            self._piece(b, position),
            top2[0] - top2[1],
            tie_threshold(top2[0], logits.dtype),
        )

    def _piece(self, ids: tuple[int, ...], position: int) -> str:
        return self.tokenizer.decode([ids[position]]) if position < len(ids) else "(end)"
