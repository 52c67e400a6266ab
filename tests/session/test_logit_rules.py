"""Rules on the target's law keep speculation exact for the law they make (speculative/constraint.py). JSON mode:
greedy speculative equals greedy target-only under the same grammar, token for token, and sampled speculative replies
follow the target's law masked by the grammar (checked against a fresh llguidance matcher per prefix, with no
rollback); replies that end are valid JSON of the schema. A logit bias and a frequency penalty: the same, against
the biased and penalized law written here from the definitions."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from conftest import make_engine, reference_probs

from specchat.config import Mode, SamplingConfig, SpeculationConfig
from specchat.session.json_mode import JsonConstraint, grammar_for, guidance_tokenizer
from specchat.session.logit_rules import FrequencyPenalty, LogitBias
from specchat.speculative.constraint import Rules
from specchat.speculative.events import ReplyDone

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "ok", "n"],
    "additionalProperties": False,
}
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=400)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    ask = [{"role": "user", "content": "The quick brown fox as JSON"}]
    return list(
        tokenizer.apply_chat_template(ask, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    )


def eos_of(tokenizer) -> set[int]:
    return {tokenizer.convert_tokens_to_ids("<|im_end|>")}


def reply(engine, tokenizer, prompt, sampling, speculation, grammar) -> ReplyDone:
    constraint = JsonConstraint(tokenizer, grammar, len(prompt), eos_of(tokenizer))
    return list(engine.stream(prompt, sampling, speculation, constraint=constraint))[-1]


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_under_a_schema_equals_target_only_and_is_valid_json(
    target, similar_drafter_model, tokenizer, prompt, gamma
):
    grammar = grammar_for(SCHEMA)
    engine = make_engine(target, similar_drafter_model, tokenizer, eos_ids=eos_of(tokenizer))
    alone = reply(engine, tokenizer, prompt, GREEDY, SpeculationConfig(mode=Mode.TARGET), grammar)
    engine.reset()
    spec = reply(engine, tokenizer, prompt, GREEDY, SpeculationConfig(gamma=gamma, drafter="model"), grammar)
    assert spec.ids == alone.ids and spec.stats.drafted > 0
    assert spec.stop_reason == "eos"
    value = json.loads(spec.text)
    assert set(value) == {"name", "ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    engine.reset()
    free = list(engine.stream(prompt, GREEDY, SpeculationConfig(mode=Mode.TARGET)))[-1]
    assert free.ids != alone.ids  # the grammar did change the reply


SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=4)
OBJECT = grammar_for(None)


def fresh_mask(tokenizer, prefix: list[int], width: int) -> torch.Tensor:
    """The grammar's mask after `prefix`, from a new llguidance matcher (no rollback), end-of-turn mapped."""
    import llguidance

    guide = guidance_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(guide, OBJECT)
    assert matcher.try_consume_tokens(prefix) == len(prefix)
    words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
    bits = ((words.view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1).bool().view(-1)[:width]
    mask = torch.zeros(width, dtype=torch.bool)
    mask[: bits.shape[0]] = bits
    return mask


@torch.inference_mode()
def masked_joint(model, tokenizer, ids, n=2) -> dict[tuple[int, ...], float]:
    joint = {(): 1.0}
    for _ in range(n):
        grown = {}
        for prefix, p_prefix in joint.items():
            logits = model(torch.tensor([ids + list(prefix)])).logits[0, -1]
            allowed = fresh_mask(tokenizer, list(prefix), logits.shape[-1])
            for token, p in reference_probs(logits.masked_fill(~allowed, float("-inf")), SAMPLED).items():
                if p > 0:
                    grown[prefix + (token,)] = p_prefix * p
        joint = grown
    return joint


def worst(joint, counts, z=4.5) -> float:
    if set(counts) - set(joint):
        return math.inf
    runs = sum(counts.values())
    return max(
        abs(counts.get(c, 0) / runs - p) / (z * math.sqrt(p * (1 - p) / runs) + 1 / runs) for c, p in joint.items()
    )


@pytest.mark.parametrize("runs", [300, pytest.param(1500, marks=pytest.mark.slow)])
def test_sampled_speculative_under_json_mode_follows_the_masked_target_law(
    target, similar_drafter_model, tokenizer, prompt, runs
):
    joint = masked_joint(target, tokenizer, prompt)
    assert len(joint) >= 4
    engine = make_engine(target, similar_drafter_model, tokenizer, eos_ids=eos_of(tokenizer))
    counts, drafted = Counter(), 0
    for seed in range(runs):
        sampling = SamplingConfig(**{**SAMPLED.__dict__, "seed": seed})
        done = reply(engine, tokenizer, prompt, sampling, SpeculationConfig(gamma=3, drafter="model"), OBJECT)
        counts[tuple(done.ids[:2])] += 1
        drafted += done.stats.drafted
    assert drafted >= runs  # the drafts ran
    assert worst(joint, counts) <= 1.0, (joint, counts)


def test_the_law_check_catches_a_mask_left_off(target, similar_drafter_model, tokenizer, prompt):
    joint = masked_joint(target, tokenizer, prompt)
    engine = make_engine(target, similar_drafter_model, tokenizer, eos_ids=eos_of(tokenizer))
    counts = Counter()
    for seed in range(300):
        sampling = SamplingConfig(**{**SAMPLED.__dict__, "seed": seed})
        done = list(engine.stream(prompt, sampling, SpeculationConfig(gamma=3, drafter="model")))[-1]
        counts[tuple(done.ids[:2])] += 1
    assert worst(joint, counts) > 1.0


BIAS = {5: 3.0, 17: -100.0, 40: 1.5}
PENALTY = 1.5


def biased_and_penalized(logits: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """The definitions: the bias added, then PENALTY subtracted once per time a token is in the reply so far."""
    out = logits.double().clone()
    for token, amount in BIAS.items():
        out[token] += amount
    for token in prefix:
        out[token] -= PENALTY
    return out


@torch.inference_mode()
def ruled_joint(model, ids, n=3) -> dict[tuple[int, ...], float]:
    joint = {(): 1.0}
    for _ in range(n):
        grown = {}
        for prefix, p_prefix in joint.items():
            logits = model(torch.tensor([ids + list(prefix)])).logits[0, -1]
            for token, p in reference_probs(biased_and_penalized(logits, list(prefix)), RULED).items():
                grown[prefix + (token,)] = p_prefix * p
        joint = grown
    return joint


RULED = SamplingConfig(temperature=0.8, top_k=4, max_new_tokens=3)


def ruled(start: int):
    return Rules([LogitBias(BIAS), FrequencyPenalty(PENALTY, start)])


def test_greedy_speculative_under_bias_and_penalty_equals_target_only(target, similar_drafter_model, tokenizer, prompt):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=40)
    alone = list(engine.stream(prompt, greedy, SpeculationConfig(mode=Mode.TARGET), constraint=ruled(len(prompt))))
    engine.reset()
    spec = list(
        engine.stream(prompt, greedy, SpeculationConfig(gamma=3, drafter="model"), constraint=ruled(len(prompt)))
    )
    engine.reset()
    free = list(engine.stream(prompt, greedy, SpeculationConfig(mode=Mode.TARGET)))
    assert spec[-1].ids == alone[-1].ids != free[-1].ids and spec[-1].stats.drafted > 0
    assert 17 not in alone[-1].ids


@pytest.mark.parametrize("runs", [300, pytest.param(1500, marks=pytest.mark.slow)])
def test_sampled_speculative_under_bias_and_penalty_follows_the_ruled_law(
    target, similar_drafter_model, tokenizer, prompt, runs
):
    joint = ruled_joint(target, prompt)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = Counter()
    for seed in range(runs):
        sampling = SamplingConfig(**{**RULED.__dict__, "seed": seed})
        done = list(
            engine.stream(prompt, sampling, SpeculationConfig(gamma=2, drafter="model"), constraint=ruled(len(prompt)))
        )[-1]
        counts[tuple(done.ids[:3])] += 1
    assert worst(joint, counts) <= 1.0


def test_the_ruled_law_check_catches_a_penalty_that_counts_the_prompt(target, similar_drafter_model, tokenizer, prompt):
    joint = ruled_joint(target, prompt)
    engine = make_engine(target, similar_drafter_model, tokenizer)
    counts = Counter()
    wrong = Rules([LogitBias(BIAS), FrequencyPenalty(PENALTY, 0)])  # counts the prompt's tokens too
    for seed in range(300):
        sampling = SamplingConfig(**{**RULED.__dict__, "seed": seed})
        done = list(engine.stream(prompt, sampling, SpeculationConfig(gamma=2, drafter="model"), constraint=wrong))[-1]
        counts[tuple(done.ids[:3])] += 1
    assert worst(joint, counts) > 1.0


def grammar_refused_drafts(target, drafter, tokenizer, prompt) -> int:
    """Drafts of a greedy JSON-mode reply that the grammar refuses where they were drafted (a fresh matcher each)."""
    import llguidance

    from specchat.speculative.step import StepResult

    engine = make_engine(target, drafter, tokenizer, eos_ids=eos_of(tokenizer))
    constraint = JsonConstraint(tokenizer, OBJECT, len(prompt), eos_of(tokenizer))
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=120)
    reply, refused = [], 0
    for step in engine.steps(prompt, sampling, SpeculationConfig(gamma=4, drafter="model"), constraint=constraint):
        if not isinstance(step, StepResult):
            continue
        drafts = step.tokens[: step.accepted] + list(step.rejected)
        matcher = llguidance.LLMatcher(guidance_tokenizer(tokenizer), OBJECT)
        assert matcher.try_consume_tokens(reply) == len(reply)
        refused += len(drafts) - matcher.try_consume_tokens(drafts)
        reply += step.tokens
    return refused


def test_a_drafter_under_json_mode_drafts_only_what_the_grammar_allows(
    target, similar_drafter_model, tokenizer, prompt, monkeypatch
):
    assert grammar_refused_drafts(target, similar_drafter_model, tokenizer, prompt) == 0
    import specchat.speculative.reply

    monkeypatch.setattr(specchat.speculative.reply, "for_drafts", lambda constraint: None)  # q left unmasked
    assert grammar_refused_drafts(target, similar_drafter_model, tokenizer, prompt) > 0


class OnlyUnseenHighIds:
    """Allows only ids at or above `floor` that `seen` lacks: a drafter that scores the ids below the floor and those
    seen has an empty row at the reply's start."""

    def __init__(self, floor: int, seen: list[int]):
        self.banned = sorted(set(range(floor)) | set(seen))

    def apply(self, logits, contexts):
        out = logits.clone()
        out[:, self.banned] = float("-inf")
        return out


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_drafter_row_the_rules_leave_empty_ends_the_draft_and_the_reply_goes_on(
    target, similar_drafter_model, tokenizer, prompt, temperature
):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=12, seed=3)
    speculation = SpeculationConfig(gamma=3, drafter="model", drafter_vocab=64)  # it scores ids below 64 and seen
    end = list(engine.stream(prompt, sampling, speculation, constraint=OnlyUnseenHighIds(64, prompt)))[-1]
    assert len(end.ids) == 12 and min(end.ids) >= 64 and not set(end.ids) & set(prompt)
