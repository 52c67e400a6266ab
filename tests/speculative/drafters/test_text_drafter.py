"""The text drafter: a drafter model of another tokenizer drafts text, re-tokenized into the target's ids and
proposed one-hot. Greedy output stays the target's token for token, sampled output keeps the target's law."""

from __future__ import annotations

import pytest
from conftest import CheapDrafterGamma, hf_greedy, make_engine, noisy_head_copy, prompt_ids, run_reply
from text_pairs import (
    OTHER_CORPUS,
    exact_first_two,
    renumbered_model,
    renumbered_tokenizer,
    renumbering,
    sampled_first_two,
    text_tokenizer,
    worst_deviation,
)
from tiny_models import build_model

from specchat.config import AUTO, SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.drafters.text import TextDrafter, drafter_for
from specchat.speculative.engine import Engine
from specchat.speculative.events import Origin, Rejected
from specchat.tui.why_view import source_words

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=40)
CODE = "def reverse(lst):\n"


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: the tiny models on one thread


@pytest.fixture(scope="module")
def tok():
    return text_tokenizer()


@pytest.fixture(scope="module")
def text_target(tok):
    return build_model(len(tok), seed=1, layers=3)


@pytest.fixture(scope="module")
def renumbered(tok):
    """The target's tokenizer under another numbering: every id differs, the text is the same."""
    new_ids = renumbering(len(tok))
    return renumbered_tokenizer(tok, new_ids), new_ids


def text_engine(target, tok, drafter_model, drafter_tok) -> Engine:
    return Engine(target, tok, TextDrafter(drafter_model, tok, drafter_tok, len(tok)), eos_ids=())


def target_alone(target, tok, ids):
    return list(run_reply(make_engine(target, None, tok), ids, gamma=0, mode="target")[1].ids)


def test_the_renumbered_tokenizer_speaks_other_ids_for_the_same_text(tok, renumbered):
    theirs, new_ids = renumbered
    assert theirs.encode(CODE) == [new_ids[i] for i in tok.encode(CODE)] != tok.encode(CODE)


def test_a_drafter_with_a_tokenizer_of_its_own_drafts_text(tok, text_target, renumbered):
    assert isinstance(drafter_for(text_target, len(tok), tok), ModelDrafter)
    assert isinstance(drafter_for(text_target, len(tok), tok, renumbered[0]), TextDrafter)


def test_greedy_text_drafting_equals_the_target_alone_and_its_drafts_are_judged(tok, text_target, renumbered):
    theirs, new_ids = renumbered
    drafter = renumbered_model(noisy_head_copy(text_target), new_ids)
    ids = prompt_ids(tok, CODE)
    events, done = run_reply(text_engine(text_target, tok, drafter, theirs), ids, gamma=4)
    assert list(done.ids) == target_alone(text_target, tok, ids) == hf_greedy(text_target, ids, 40)
    assert 0 < done.stats.accepted < done.stats.drafted
    drafted = [e for e in events if getattr(e, "origin", None) == Origin.DRAFTED]
    assert drafted and all(token.odds.q == 1.0 and token.source == "text" for token in drafted)  # one-hot, named
    refused = [e.detail for e in events if isinstance(e, Rejected)]
    assert refused and {source_words(r) for r in refused} == {"by the model as text"}  # what /why says


def test_auto_gamma_drafts_as_text_and_stays_exact(tok, text_target, renumbered):
    theirs, new_ids = renumbered
    drafter = TextDrafter(renumbered_model(noisy_head_copy(text_target), new_ids), tok, theirs, len(tok))
    engine = Engine(text_target, tok, drafter, eos_ids=(), policy=CheapDrafterGamma())
    ids = prompt_ids(tok, CODE)
    _, done = run_reply(engine, ids, gamma=AUTO)
    assert list(done.ids) == target_alone(text_target, tok, ids) and done.stats.accepted > 0


def test_a_drafter_that_is_the_target_renumbered_has_every_draft_accepted(tok, text_target, renumbered):
    """Where the target writes text as its tokenizer would encode it, the re-tokenized drafts are its own tokens:
    the translation neither shifts, drops nor invents an id."""
    theirs, new_ids = renumbered
    ids = prompt_ids(tok, CODE)
    _, done = run_reply(text_engine(text_target, tok, renumbered_model(text_target, new_ids), theirs), ids, gamma=4)
    assert list(done.ids) == target_alone(text_target, tok, ids)
    assert done.stats.drafted >= 30 and done.stats.accepted == done.stats.drafted


@pytest.mark.parametrize("text", ["The quick brown fox jumps", CODE, "Hello, how are you today?\n"])
def test_a_random_drafter_of_an_unrelated_tokenizer_stays_exact(tok, text_target, text):
    theirs = text_tokenizer(OTHER_CORPUS, 200)
    drafter = build_model(len(theirs), seed=2, layers=1, hidden=32)
    ids = prompt_ids(tok, text)
    _, done = run_reply(text_engine(text_target, tok, drafter, theirs), ids, gamma=3)
    assert list(done.ids) == target_alone(text_target, tok, ids)
    assert done.stats.drafted > 0


def test_turn_after_turn_the_drafter_reads_only_the_new_text_and_stays_exact(tok, text_target, renumbered):
    theirs, new_ids = renumbered
    engine = text_engine(text_target, tok, renumbered_model(noisy_head_copy(text_target), new_ids), theirs)
    history = prompt_ids(tok, "Hello, how are you")
    for turn in ("for i in range(10):", "The quick brown"):
        _, spec = run_reply(engine, history, gamma=4)
        assert list(spec.ids) == target_alone(text_target, tok, history)
        cached = engine.drafter.inner.cached
        history = history + list(spec.ids) + prompt_ids(tok, turn)
        engine.drafter.observe(history, read=len(history) - 1)
        assert engine.drafter.inner.cached > cached >= len(engine.drafter.stream) // 2  # kept, then read on
    assert spec.stats.reused_tokens > 0


def test_auto_and_drafter_only_modes_with_a_text_drafter(tok, text_target, renumbered):
    theirs, new_ids = renumbered
    engine = text_engine(text_target, tok, renumbered_model(text_target, new_ids), theirs)
    ids = prompt_ids(tok, CODE)
    auto = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=4, drafter="auto")))[-1]
    assert list(auto.ids) == target_alone(text_target, tok, ids) and auto.stats.drafted > 0
    alone = list(engine.stream(ids, GREEDY, SpeculationConfig(gamma=4, mode="drafter")))[-1]
    drafter_text = theirs.decode(hf_greedy(renumbered_model(text_target, new_ids), theirs.encode(CODE), 60))
    assert len(alone.ids) == 40 and drafter_text.startswith(tok.decode(list(alone.ids)))  # the drafter's own text


def test_a_drafted_end_of_turn_becomes_the_targets(tok, renumbered):
    theirs, new_ids = renumbered
    drafter = TextDrafter(build_model(len(theirs), seed=2, layers=1, hidden=32), tok, theirs, len(tok))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert drafter.ends[new_ids[im_end]] == im_end
    ids = tok.encode("Hello")
    assert drafter._target_ids(
        ids, theirs.encode("Hello"), theirs.encode(" world<|im_end|>"), final=False
    ) == tok.encode(" world") + [im_end]  # text before an end is final: its last id stays
    assert (
        drafter._target_ids(ids, theirs.encode("Hello"), theirs.encode(" world, how"), final=False)
        == tok.encode(" world, how")[:-1]
    )  # the last id could still grow ("how" -> "how are")


SAMPLING = SamplingConfig(temperature=0.8, top_k=6, top_p=0.9)


@pytest.mark.parametrize("runs", [100, pytest.param(1500, marks=pytest.mark.slow)])
def test_sampled_text_drafting_keeps_the_targets_law(tok, text_target, renumbered, runs):
    theirs, new_ids = renumbered
    ids = prompt_ids(tok, CODE)
    joint = exact_first_two(text_target, ids, SAMPLING)
    assert 4 <= len(joint) <= 36
    engine = text_engine(text_target, tok, renumbered_model(text_target, new_ids), theirs)
    counts, accepted = sampled_first_two(engine, ids, SAMPLING, runs, gamma=2)
    assert accepted >= runs // 5  # drafts are accepted, and (the law being spread) rejected
    assert worst_deviation(joint, counts) <= 1.0
