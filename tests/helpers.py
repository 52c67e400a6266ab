"""Helpers shared by the tests: engines on the tiny conftest models, one reply run to its end,
transformers' greedy reference, the next-token law written from the definitions, and a ScriptedEngine
that replays canned events so the REPL and render tests assert the whole screen. Tests import them
from conftest (`from conftest import make_engine`), which loads this module on first use."""

from __future__ import annotations

import math

import torch

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.engine import Engine
from specchat.speculative.events import Origin, Rejected, ReplyDone, StepDone, Token
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.metrics import ReplyStats

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=40)


def make_engine(target, drafter_model, tokenizer, eos_ids=(), policy=None) -> Engine:
    drafter = ModelDrafter(drafter_model, len(tokenizer)) if drafter_model is not None else None
    return Engine(target, tokenizer, drafter, eos_ids=eos_ids, policy=policy)


class FixedCostGamma(AutoGamma):
    """Auto gamma that takes the drafter to cost `cost` target steps, whatever the clock says."""

    cost = 0.1

    @property
    def cost_ratio(self) -> float:
        return self.cost

    @property
    def planning_ratio(self) -> float:
        return self.cost


class CheapDrafterGamma(FixedCostGamma):
    """Auto gamma that takes the drafter to cost a tenth of the target, as the int8 0.5B drafter does
    (the tiny test drafters cost about as much as the tiny targets, so auto gamma would not draft)."""

    cost = 0.1


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def noisy_head_copy(model, spread: float = 0.6, seed: int = 5):
    """A drafter for `model`: a deep copy whose output head has noise of `spread` × its weights' std."""
    import copy

    drafter = copy.deepcopy(model)
    with torch.no_grad():
        head = drafter.lm_head.weight
        head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(seed)) * head.std() * spread)
    return drafter


def assert_greedy_spec_is_target_only(target, drafter, tokenizer, text: str, gamma) -> None:
    """Greedy speculative == greedy target-only on `text`, with drafts made and some rejected."""
    ids = prompt_ids(tokenizer, text)
    _, target_only = run_reply(make_engine(target, None, tokenizer), ids, gamma=0, mode="target")
    _, spec = run_reply(make_engine(target, drafter, tokenizer, policy=CheapDrafterGamma()), ids, gamma=gamma)
    assert list(spec.ids) == list(target_only.ids)
    assert spec.stats.drafted > 0 and spec.stats.acceptance_rate < 0.95  # drafts do get rejected


def assert_multi_turn_exact(target, drafter, tokenizer) -> None:
    """Three turns on one engine each: speculative == target-only while the caches are reused."""
    spec_engine, solo_engine = make_engine(target, drafter, tokenizer), make_engine(target, None, tokenizer)
    history = prompt_ids(tokenizer, "Hello, how are you")
    for turn in ("for i in range(10):", "The quick brown"):
        _, spec = run_reply(spec_engine, history, gamma=4)
        _, solo = run_reply(solo_engine, history, gamma=0, mode="target")
        assert list(spec.ids) == list(solo.ids)
        history = history + list(spec.ids) + prompt_ids(tokenizer, turn)
    assert spec.stats.reused_tokens > 0


def run_reply(engine, ids, sampling=GREEDY, gamma=4, mode="spec", cancel=None):
    """One reply streamed to its end: (every event, the final ReplyDone)."""
    events = list(engine.stream(ids, sampling, SpeculationConfig(gamma=gamma, mode=mode), cancel))
    done = events[-1]
    assert isinstance(done, ReplyDone)
    return events, done


def reference_probs(logits: torch.Tensor, sampling: SamplingConfig) -> dict[int, float]:
    """Next-token law written from the definitions, independent of specchat.speculative.sampling: softmax of
    logits / T over the top_k tokens, then the most likely of those until their mass reaches top_p, then those at
    least min_p times as likely as the most likely, renormalized; a token tied with the last one kept at the top-k
    or top-p cut is kept too. Plain Python, float64."""
    scaled = [x / sampling.temperature for x in logits.double().tolist()]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    if sampling.top_k:
        order = [i for i in order if scaled[i] >= scaled[order[min(sampling.top_k, len(order)) - 1]]]
    weights = {i: math.exp(scaled[i] - scaled[order[0]]) for i in order}
    total = sum(weights.values())
    kept, mass = [], 0.0
    for i in order:
        if mass >= sampling.top_p and scaled[i] != scaled[kept[-1]]:
            break
        kept.append(i)
        mass += weights[i] / total
    kept = [i for i in kept if weights[i] >= sampling.min_p]  # weights are relative to the most likely (1.0)
    norm = sum(weights[i] for i in kept)
    return {i: weights[i] / norm for i in kept}


def hf_greedy(model, ids, n):
    """transformers' greedy continuation of `ids`: exactly n new token ids (no stop token)."""
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(ids) :].tolist()


class ScriptedEngine:
    """Stands in for speculative.engine.Engine in UI tests: each stream() call replays the next canned
    reply's events (Token/Rejected/StepDone, then its ReplyDone) with no model, so a test can assert
    the whole screen. Like the real engine, `ids` holds the prompt plus the reply afterwards."""

    def __init__(self, replies: list[list], with_drafter: bool = True):
        self.replies = list(replies)
        self.drafter = "scripted drafter" if with_drafter else None
        self.has_model_drafter = with_drafter
        self.ids: list[int] = []
        self.prompts: list[list[int]] = []  # every prompt it was asked to answer

    def drafter_problem(self, name: str) -> str | None:
        return None  # every drafter name is fine: nothing drafts

    def reset(self) -> None:
        self.ids = []

    def stream(self, prompt_ids, sampling, speculation, cancel=None, constraint=None):
        self.prompts.append(list(prompt_ids))
        for event in self.replies.pop(0):
            if isinstance(event, ReplyDone):
                self.ids = list(prompt_ids) + list(event.ids)
            yield event


def scripted_reply(pieces, stats: ReplyStats, stop_reason: str = "eos") -> list:
    """A canned reply from (text, origin) pieces and Rejected events, in screen order: one Token per
    piece (ids 100, 101, ...; no tokenizer involved), a StepDone after each token the target wrote
    with its step's drafted and accepted counts, and a ReplyDone whose text is the pieces joined."""
    events, ids, drafted, accepted = [], [], 0, 0
    for piece in pieces:
        if isinstance(piece, Rejected):
            events.append(piece)
            drafted += len(piece.ids)
            continue
        text, origin = piece
        ids.append(100 + len(ids))
        events.append(Token(ids[-1], text, origin))
        if origin == Origin.DRAFTED:
            drafted, accepted = drafted + 1, accepted + 1
            continue
        events.append(StepDone(drafted, accepted))
        drafted, accepted = 0, 0
    text = "".join(e.text for e in events if isinstance(e, Token))
    return events + [ReplyDone(stats, text, tuple(ids), stop_reason)]


_HEADS: dict = {}


def trained_head(target, tokenizer, steps: int = 300):
    """A draft head trained for `target` in seconds (training/head_training.py) on this repository's own sources,
    once a session per target: (head, two of the batches it learnt from, the output rows it was trained against)."""
    from pathlib import Path

    from specchat.speculative.drafters.head import FeatureHead
    from specchat.training.head_training import batch, output_rows, target_states, text_files, token_chunks, train_on

    if id(target) not in _HEADS:
        torch.manual_seed(0)
        files = text_files([Path(__file__).parents[1] / "specchat" / "speculative"])
        chunks = [ids for _, ids in zip(range(12), token_chunks(files, tokenizer, 128))]
        rows = output_rows(target.get_output_embeddings(), len(tokenizer))
        data = [batch(target_states(target, ids), ids, target.get_input_embeddings(), rows) for ids in chunks]
        head = FeatureHead(rows.shape[1], 2 * rows.shape[1])
        optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
        for step in range(steps):
            train_on(head, optimizer, data[step % len(data)], rows)
        _HEADS[id(target)] = (head.eval(), data[:2], rows)
    return _HEADS[id(target)]
