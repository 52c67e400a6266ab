"""Caches, stop rules, cancel, multi-turn reuse and streamed text."""

from __future__ import annotations

import threading

import pytest
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids, run_reply

from specchat.config import RANDOM, SamplingConfig, SpeculationConfig
from specchat.speculative.events import Origin, ReplyDone, StepDone, Token


@pytest.mark.parametrize("drafter", ["unrelated_drafter_model", "similar_drafter_model"])
def test_caches_hold_the_committed_sequence_after_every_step(target, drafter, tokenizer, request):
    engine = make_engine(target, request.getfixturevalue(drafter), tokenizer)
    ids = prompt_ids(tokenizer, "for i in range")
    steps, lag = 0, 1
    for event in engine.stream(ids, GREEDY, SpeculationConfig(gamma=4)):
        if isinstance(event, StepDone):
            steps += 1
            committed = len(engine.ids)
            assert engine.target_seen == committed - 1
            # the drafter lags one more token only after a step whose drafts were all accepted
            # (and falls one further behind in a step that drafts nothing)
            lag = (2 if event.accepted == event.drafted else 1) if event.drafted else lag + 1
            assert engine.drafter.seen == committed - lag
    assert steps > 3


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 11])
@pytest.mark.parametrize("gamma", [4, 8])
def test_max_new_tokens_is_exact(target, tokenizer, limit, gamma):
    engine = make_engine(target, target, tokenizer)  # every draft accepted: the limit bites mid-draft
    ids = prompt_ids(tokenizer, "The quick brown")
    _, done = run_reply(engine, ids, SamplingConfig(temperature=0.0, max_new_tokens=limit), gamma=gamma)
    assert len(done.ids) == limit
    assert done.stop_reason == "max_tokens"
    assert list(done.ids) == hf_greedy(target, ids, limit)
    assert engine.target_seen == len(engine.ids) - 1


def test_eos_stops_and_drops_tokens_after_it(target, tokenizer):
    """The drafter is the target itself, so every draft is accepted and a step writes nine tokens: the
    EOS arrives as an accepted draft in the middle of a step, the step's later tokens are dropped, the
    caches hold the reply up to the EOS, and the next reply on the same engine is exact."""
    ids = prompt_ids(tokenizer, "Hello, how are you")
    reference = hf_greedy(target, ids, GREEDY.max_new_tokens)
    eos = reference[4]
    first = reference.index(eos)
    assert first < 8  # inside the first step's run of 8 accepted drafts, not its last token
    engine = make_engine(target, target, tokenizer, eos_ids={eos})
    events, done = run_reply(engine, ids, gamma=8)
    tokens = [e for e in events if isinstance(e, Token)]
    assert list(done.ids) == reference[: first + 1] and done.stop_reason == "eos"
    assert tokens[-1].id == eos and tokens[-1].origin == Origin.DRAFTED  # nothing follows it
    step = next(e for e in events if isinstance(e, StepDone))
    assert step.accepted == step.drafted == 8 > len(tokens)  # the run went on past the EOS and was cut
    assert engine.target_seen == len(engine.ids) - 1 and engine.drafter.seen <= len(engine.ids) - 1
    follow_up = ids + list(done.ids) + prompt_ids(tokenizer, " and the fox?")
    _, again = run_reply(engine, follow_up, gamma=8)
    expected = hf_greedy(target, follow_up, GREEDY.max_new_tokens)
    assert list(again.ids) == (expected[: expected.index(eos) + 1] if eos in expected else expected)


def test_cancel_stops_within_a_step_and_the_next_reply_is_exact(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    ids = prompt_ids(tokenizer, "def reverse(lst):")
    cancel = threading.Event()
    steps_after_cancel = 0
    for event in engine.stream(ids, GREEDY, SpeculationConfig(gamma=4), cancel):
        if isinstance(event, StepDone):
            steps_after_cancel += cancel.is_set()
            cancel.set()
        if isinstance(event, ReplyDone):
            done = event
    assert done.stop_reason == "cancelled" and steps_after_cancel == 0
    assert list(done.ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)[: len(done.ids)]
    assert engine.target_seen == len(engine.ids) - 1
    other = prompt_ids(tokenizer, "The quick brown fox")
    _, again = run_reply(engine, other, gamma=4)
    assert list(again.ids) == hf_greedy(target, other, GREEDY.max_new_tokens)


def test_follow_up_turn_reuses_both_caches_and_stays_exact(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    first = prompt_ids(tokenizer, "Hello, how are you")
    _, turn1 = run_reply(engine, first, gamma=4)
    follow_up = first + list(turn1.ids) + prompt_ids(tokenizer, " and the fox?")
    _, turn2 = run_reply(engine, follow_up, gamma=4)
    assert turn2.stats.reused_tokens == len(first) + len(turn1.ids) - 1  # the reply's last token was fed, not cached
    assert list(turn2.ids) == hf_greedy(target, follow_up, GREEDY.max_new_tokens)
    edited = first[:3] + prompt_ids(tokenizer, " lazy dog")  # history edited: reuse only the prefix
    _, turn3 = run_reply(engine, edited, gamma=4)
    assert turn3.stats.reused_tokens == 3
    assert list(turn3.ids) == hf_greedy(target, edited, GREEDY.max_new_tokens)


def test_streamed_text_equals_decode_of_the_reply(target, unrelated_drafter_model, tokenizer):
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=60, seed=3)
    events, done = run_reply(engine, prompt_ids(tokenizer, "日本 é"), sampling=sampling, gamma=3)
    streamed = "".join(e.text for e in events if isinstance(e, Token))
    assert streamed == done.text == tokenizer.decode(list(done.ids), skip_special_tokens=True)
    assert "\ufffd" not in streamed or "\ufffd" in done.text


@pytest.mark.parametrize("mode,gamma", [("spec", 3), ("target", 0)])
def test_a_prompt_gets_a_target_forward_of_its_own_before_any_draft(
    target, similar_drafter_model, tokenizer, monkeypatch, mode, gamma
):
    """The prompt's rows never share a forward with drafts, so a batch-invariant target caches the
    prompt bitwise the same in speculative and target-only decoding, however long the prompt is."""
    import specchat.speculative.step as step

    fed, original = [], step.model_io.forward_tensor
    monkeypatch.setattr(
        step.model_io,
        "forward_tensor",
        lambda model, cache, ids, keep: (
            (fed.append(ids.shape[1]) if model is target else None) or original(model, cache, ids, keep)
        ),
    )
    engine = make_engine(target, similar_drafter_model, tokenizer)
    ids = prompt_ids(tokenizer, "for i in range(10):\n    print(i")
    history = (
        ids
        + list(run_reply(engine, ids, gamma=gamma, mode=mode)[1].ids)
        + prompt_ids(tokenizer, " The quick brown fox jumps")
    )
    assert fed[:2] == [len(ids) - 1, 1 + gamma]  # the prompt but its last token, then that token + drafts
    fed.clear()
    new_turn = len(history) - engine.target_seen
    run_reply(engine, history, gamma=gamma, mode=mode)
    assert new_turn > 2 and fed[:2] == [new_turn - 1, 1 + gamma]  # a follow-up turn: the same, after the reuse


def test_sampling_greedy_on_overrides_a_temperature(target, unrelated_drafter_model, tokenizer):
    """sampling.greedy = true with temperature 0.9: the reply is greedy (transformers' own), whatever the seed."""
    ids = prompt_ids(tokenizer, "The quick brown")
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    replies = {
        tuple(
            run_reply(
                engine,
                ids,
                SamplingConfig(temperature=0.9, top_k=50, greedy=True, seed=seed, max_new_tokens=20),
                gamma=4,
            )[1].ids
        )
        for seed in (0, 1, 2)
    }
    assert replies == {tuple(hf_greedy(target, ids, 20))}


def test_an_exception_mid_reply_resets_the_engine_and_the_next_reply_is_exact(
    target, unrelated_drafter_model, tokenizer
):
    """A forward that raises mid-reply (after the engine cached some of it) leaves both caches empty, not
    half-updated, and the next reply on the same engine is exact."""
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    calls = []

    def fail_on_the_fourth_forward(module, args):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("out of memory (planted)")

    handle = target.register_forward_pre_hook(fail_on_the_fourth_forward)
    try:
        ids = prompt_ids(tokenizer, "def reverse(lst):")
        with pytest.raises(RuntimeError, match="planted"):
            run_reply(engine, ids, gamma=4)
    finally:
        handle.remove()
    assert engine.ids == [] and engine.target_seen == 0 and engine.drafter.seen == 0
    other = prompt_ids(tokenizer, "The quick brown fox")
    _, again = run_reply(engine, other, gamma=4)
    assert list(again.ids) == hf_greedy(target, other, GREEDY.max_new_tokens)


def test_seed_random_draws_a_fresh_seed_each_reply_and_reports_it(target, unrelated_drafter_model, tokenizer):
    """sampling.seed = RANDOM (/seed random): each reply draws its own seed and reports it, and that seed
    given back reproduces the reply."""
    ids = prompt_ids(tokenizer, "The quick brown")
    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    free = SamplingConfig(temperature=1.0, seed=RANDOM, max_new_tokens=12)
    replies = [run_reply(engine, ids, free, gamma=3)[1] for _ in range(3)]
    seeds = [r.seed for r in replies]
    assert len(set(seeds)) == 3 and min(seeds) >= 0
    again = run_reply(engine, ids, SamplingConfig(temperature=1.0, seed=seeds[1], max_new_tokens=12), gamma=3)[1]
    assert again.ids == replies[1].ids and again.seed == seeds[1]


def test_a_fork_runs_on_the_same_models_with_caches_and_a_policy_of_its_own(target, unrelated_drafter_model, tokenizer):
    """What the drafter race reruns on: the chat's engine and its caches untouched, the same reply as the chat's."""
    from specchat.speculative.engine import run_to_end
    from specchat.speculative.gamma import AutoGamma

    engine = make_engine(target, unrelated_drafter_model, tokenizer)
    ids = prompt_ids(tokenizer, "for i in range")
    spec = SpeculationConfig(gamma=3)
    first = run_to_end(engine.steps(ids, GREEDY, spec))
    fork = engine.fork()
    assert fork.target is engine.target and fork.drafter.model is engine.drafter.model
    assert fork.sampler is engine.sampler and fork.policy is not engine.policy and fork.ids == []
    seen = engine.target_seen
    assert run_to_end(fork.steps(ids, GREEDY, spec)).ids == first.ids
    assert engine.target_seen == seen and engine.drafter is not fork.drafter
    fresh = AutoGamma()
    engine.use_policy(fresh)
    assert engine.policy is fresh and fork.policy is not fresh
