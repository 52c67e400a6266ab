"""The Python API on tiny models: the same engine as the chat, checked against transformers."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy

import specchat
from specchat.speculative.events import Origin, ReplyDone, Token

PROMPT = "def reverse(lst):"


def test_greedy_speculative_equals_autoregressive_equals_transformers(target, similar_drafter_model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    result = specchat.speculative_generate(
        ids, similar_drafter_model, target, tokenizer, gamma=4, max_new_tokens=40, eos_token_ids=[]
    )
    alone = specchat.autoregressive_generate(ids, target, tokenizer, max_new_tokens=40, eos_token_ids=[])
    assert result.ids == alone.ids == hf_greedy(target, ids, 40)
    assert result.text == tokenizer.decode(result.ids, skip_special_tokens=True)
    assert [t.id for t in result.tokens] == result.ids
    assert {t.origin for t in result.tokens} >= {Origin.DRAFTED}
    assert {t.origin for t in alone.tokens} == {Origin.TARGET}
    assert result.stats.drafted > 0 and 0 < result.acceptance_rate <= 1
    assert result.acceptance_rate == result.stats.accepted / result.stats.drafted


def test_it_unpacks_like_the_research_repos(target, similar_drafter_model, tokenizer):
    ids, alpha = specchat.speculative_generate(
        torch.tensor([tokenizer.encode(PROMPT)]), similar_drafter_model, target, max_new_tokens=12, eos_token_ids=[]
    )
    assert len(ids) == 12 and all(isinstance(i, int) for i in ids) and 0 <= alpha <= 1


def test_without_a_tokenizer_there_is_no_text_and_the_ids_are_the_same(target, similar_drafter_model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    with_text = specchat.speculative_generate(
        ids, similar_drafter_model, target, tokenizer, max_new_tokens=16, eos_token_ids=[], gamma="auto"
    )
    bare = specchat.speculative_generate(
        ids, similar_drafter_model, target, max_new_tokens=16, eos_token_ids=[], gamma="auto"
    )
    assert bare.ids == with_text.ids and bare.text is None and {t.text for t in bare.tokens} == {""}


def test_stream_yields_tokens_then_one_reply_done(target, similar_drafter_model, tokenizer):
    events = list(
        specchat.stream(
            tokenizer.encode(PROMPT), similar_drafter_model, target, tokenizer, max_new_tokens=10, eos_token_ids=[]
        )
    )
    assert isinstance(events[-1], ReplyDone) and sum(isinstance(e, ReplyDone) for e in events) == 1
    tokens = [e for e in events if isinstance(e, Token)]
    assert "".join(t.text for t in tokens) == events[-1].text
    assert tuple(t.id for t in tokens) == events[-1].ids


def test_eos_ids_stop_the_reply(target, similar_drafter_model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    free = specchat.speculative_generate(ids, similar_drafter_model, target, max_new_tokens=20, eos_token_ids=[])
    stop = free.ids[5]
    cut = specchat.speculative_generate(ids, similar_drafter_model, target, max_new_tokens=20, eos_token_ids=stop)
    assert cut.ids == free.ids[: free.ids.index(stop) + 1] and cut.stop_reason == "eos"


def test_sampled_replies_repeat_with_a_seed(target, similar_drafter_model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    runs = [
        specchat.speculative_generate(
            ids,
            similar_drafter_model,
            target,
            temperature=1.0,
            top_p=0.9,
            max_new_tokens=16,
            eos_token_ids=[],
            seed=seed,
        ).ids
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] != runs[2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gamma": 17}, "gamma must be an integer from 0 to 16 or 'auto', got 17"),
        ({"gamma": "fast"}, "gamma must be an integer from 0 to 16 or 'auto', got 'fast'"),
        ({"temperature": -0.5}, "temperature must be ≥ 0 (0 = greedy), got -0.5"),
        ({"top_p": 0}, "top_p must be in (0, 1] (1 = off), got 0"),
        ({"top_k": -1}, "top_k must be an integer ≥ 0 (0 = off), got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer ≥ 1, got 0"),
        ({"input_ids": []}, "input_ids is empty: give at least one token id"),
        (
            {"input_ids": torch.zeros(2, 3, dtype=torch.long)},
            "input_ids must be a list of ids or a 1-D (or [1, n]) tensor",
        ),
        ({"drafter": None}, "speculative_generate needs a drafter model"),
    ],
)
def test_bad_arguments_get_one_clear_value_error(target, similar_drafter_model, tokenizer, kwargs, message):
    call = {"input_ids": tokenizer.encode(PROMPT), "drafter": similar_drafter_model, "target": target} | kwargs
    with pytest.raises(ValueError) as caught:
        specchat.speculative_generate(**call)
    assert str(caught.value).startswith(message)


def test_a_keyword_no_function_takes_is_a_type_error_that_lists_the_keywords(target, similar_drafter_model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'; the keywords are gamma, temp"):
        specchat.speculative_generate(ids, similar_drafter_model, target, temprature=0.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'gamma'; the keywords are temperature, top_k"):
        specchat.autoregressive_generate(ids, target, gamma=4)


def test_a_drafter_with_a_smaller_vocabulary_is_refused(target, tokenizer):
    from tiny_models import build_model

    small = build_model(len(tokenizer) - 10, seed=3, layers=1, hidden=32)
    with pytest.raises(ValueError, match="the drafter scores .* token ids but the target's vocabulary has"):
        specchat.speculative_generate(tokenizer.encode(PROMPT), small, target, tokenizer)


def test_help_lists_the_public_names():
    import pydoc

    text = pydoc.render_doc(specchat)
    for name in specchat.__all__:
        assert name in text
    for name in ("speculative_generate", "autoregressive_generate", "stream", "load_pair"):
        assert getattr(specchat, name).__doc__


def readme_python_blocks() -> list[str]:
    """The ```python blocks of the README's Python API section, in order."""
    from pathlib import Path

    text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def test_the_readme_examples_run_on_tiny_models(target, similar_drafter_model, tokenizer, monkeypatch, capsys):
    """Each example runs as written, with the hub loaders and load_pair handing out the tiny models."""
    import types

    import transformers

    models = {"Qwen/Qwen2.5-Coder-1.5B-Instruct": target, "Qwen/Qwen2.5-Coder-0.5B-Instruct": similar_drafter_model}
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda name, **_: models[name])
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda name, **_: tokenizer)
    pair = types.SimpleNamespace(target=target, drafter=similar_drafter_model, tokenizer=tokenizer)
    monkeypatch.setattr(specchat, "load_pair", lambda config=None, **overrides: pair)
    blocks = readme_python_blocks()
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # the docs' own code, run as a user would
    printed = capsys.readouterr().out
    assert "of drafts accepted" in printed and "acceptance" in printed and "\033[" in printed
