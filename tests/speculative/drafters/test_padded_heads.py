"""A drafter whose head scores fewer ids than the target's vocabulary (Qwen's 7B+ files pad theirs to 152,064 rows,
the small ones to 151,936): it never drafts an id past its head, reads such an id in the conversation as its
last one, and the output stays exactly the target's."""

from __future__ import annotations

import pytest
from conftest import hf_greedy, noisy_head_copy, prompt_ids
from text_pairs import exact_first_two, narrowed_model, padded_tokenizer, sampled_first_two, worst_deviation
from tiny_models import build_model

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.engine import Engine
from specchat.speculative.events import ReplyEnd
from specchat.speculative.step import StepResult

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=40)
NARROWER = 64


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: the tiny models on one thread


def steps(engine, ids, sampling=GREEDY, **speculation):
    items = list(engine.steps(ids, sampling, SpeculationConfig(gamma=4, **speculation)))
    assert isinstance(items[-1], ReplyEnd)
    return items[-1], [s for s in items if isinstance(s, StepResult)]


def drafted_ids(results) -> list[int]:
    return [int(i) for s in results if s.draft is not None for i in s.draft.tokens.tolist()]


@pytest.mark.parametrize("speculation", [{}, {"drafter_vocab": 300}, {"prompt_lookup": True}])
def test_a_narrower_drafter_never_drafts_past_its_head_and_stays_exact(target, tokenizer, speculation):
    width = len(tokenizer) - NARROWER
    drafter = ModelDrafter(narrowed_model(noisy_head_copy(target), width), len(tokenizer))
    ids = prompt_ids(tokenizer, "def reverse(lst):\n    return lst[::-1]\ndef reverse(lst):")
    assert max(ids) >= width  # the conversation holds ids the drafter has no row for
    end, results = steps(Engine(target, tokenizer, drafter, eos_ids=()), ids, **speculation)
    assert list(end.ids) == hf_greedy(target, ids, 40)
    assert 0 < end.stats.accepted < end.stats.drafted and max(drafted_ids(results)) < width


@pytest.fixture(scope="module")
def padded_pair(tokenizer):
    """A target whose tokenizer lists NARROWER placeholder ids past its own (a padded GGUF vocabulary), scored
    by its head, and a drafter of the unpadded width: the target's weights less those rows, its head noisy."""
    padded = padded_tokenizer(tokenizer, NARROWER)
    target = build_model(len(padded), seed=7, layers=3)
    return padded, target, narrowed_model(noisy_head_copy(target), len(tokenizer))


def test_a_padded_target_vocabulary_keeps_greedy_exact_when_the_target_says_a_padded_id(padded_pair, tokenizer):
    padded, target, drafter = padded_pair
    ids = prompt_ids(padded, "The quick brown fox jumps over")
    engine = Engine(target, padded, ModelDrafter(drafter, len(padded)), eos_ids=())
    end, results = steps(engine, ids)
    assert list(end.ids) == hf_greedy(target, ids, 40)
    assert max(end.ids) >= len(tokenizer)  # the target wrote a padded id, which the drafter then read
    assert end.stats.accepted > 0 and max(drafted_ids(results)) < len(tokenizer)


@pytest.mark.parametrize("runs", [100, pytest.param(1500, marks=pytest.mark.slow)])
def test_sampled_drafts_of_a_padded_pair_keep_the_targets_law(padded_pair, tokenizer, runs):
    padded, target, drafter = padded_pair
    sampling = SamplingConfig(temperature=0.8, top_k=6, top_p=0.9)
    ids = prompt_ids(padded, "The quick brown")
    joint = exact_first_two(target, ids, sampling)
    assert 4 <= len(joint) <= 36
    engine = Engine(target, padded, ModelDrafter(drafter, len(padded)), eos_ids=())
    counts, accepted = sampled_first_two(engine, ids, sampling, runs, gamma=2)
    assert accepted >= runs // 5 and worst_deviation(joint, counts) <= 1.0
