"""The pair check: one tokenizer, vocabularies padded apart (at most 128 ids), or different tokenizers (the drafter
drafts text); BOS/EOS and the chat template said; a verdict in one line, and the loaded pair drafting as it says."""

from __future__ import annotations

import pytest
from model_files import save_dir
from text_pairs import OTHER_CORPUS, narrowed_model, padded_tokenizer, text_tokenizer
from tiny_models import build_model, build_tokenizer

from specchat.config import Config, ModelConfig, SamplingConfig, SpeculationConfig
from specchat.errors import ModelLoadError
from specchat.loading.models import load_pair
from specchat.loading.pair_check import PAD_LIMIT, judge_pair
from specchat.loading.tokenizer_check import check_pair
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.drafters.text import TextDrafter
from specchat.speculative.engine import Engine
from specchat.tui.render import banner


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    """device "auto" means the CPU here, as in test_models.py."""
    from specchat.loading import plan

    monkeypatch.setattr(plan, "resolve_device", lambda device: "cpu" if device in ("auto", "cpu") else device)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def drafter(tok):
    return build_model(len(tok), seed=4, layers=1, hidden=32)


def test_one_tokenizer(tok, drafter):
    verdict = judge_pair(tok, tok, drafter, "d")
    assert (verdict.kind, verdict.text_drafting) == ("same", False)
    assert verdict.line() == "pair: one tokenizer (384 ids) · BOS/EOS agree · chat template agrees"


def test_a_vocabulary_longer_by_a_few_ids_is_padded_apart(tok):
    theirs = build_tokenizer()
    theirs.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    verdict = judge_pair(tok, theirs, build_model(len(theirs), seed=4, layers=1, hidden=32), "d")
    assert verdict.kind == "padded" and (verdict.target_ids, verdict.drafter_ids) == (384, 385)
    check_pair(tok, theirs, build_model(len(theirs), seed=4, layers=1, hidden=32), "t", "d")  # ids shared: no error


def test_a_drafter_head_narrower_by_at_most_128_ids_is_padded_apart(tok, drafter):
    verdict = judge_pair(tok, tok, narrowed_model(drafter, len(tok) - 10), "d")
    assert verdict.kind == "padded"
    assert (
        "vocabularies padded apart (target 384 ids, drafter 384, its head 374; target ids past 374 never "
        "drafted)" in verdict.line()
    )
    assert judge_pair(tok, tok, narrowed_model(drafter, len(tok) - PAD_LIMIT), "d").kind == "padded"


def test_padding_wider_than_128_ids_is_drafted_as_text(tok, drafter):
    verdict = judge_pair(padded_tokenizer(tok, PAD_LIMIT + 1), tok, drafter, "d")
    assert verdict.kind == "text" and "513 and 384 ids, padded apart by more than 128" in verdict.line()


def test_another_tokenizer_is_drafted_as_text_and_what_differs_is_said(tok):
    theirs = text_tokenizer(OTHER_CORPUS, 200)
    theirs.eos_token, theirs.chat_template = "<|endoftext|>", "{{ messages }}"
    verdict = judge_pair(tok, theirs, build_model(len(theirs), seed=4, layers=1, hidden=32), "d")
    assert verdict.text_drafting and verdict.difference.startswith("id 3 is ")
    line = verdict.line()
    assert line.startswith("pair: different tokenizers (id 3 is ") and "the drafter drafts text" in line
    assert "EOS differs ('<|im_end|>' / '<|endoftext|>')" in line and "chat templates differ" in line
    assert "\n" not in line
    with pytest.raises(ModelLoadError, match="use different tokenizers"):  # id-by-id tools still refuse it
        check_pair(tok, theirs, build_model(len(theirs), seed=4, layers=1, hidden=32), "t", "d")


def test_a_drafter_whose_head_is_far_narrower_than_its_own_tokenizer_is_refused(tok, drafter):
    with pytest.raises(
        ModelLoadError, match="drafter d scores 200 token ids but its tokenizer has 384; the checkpoint is inconsistent"
    ):
        judge_pair(tok, tok, narrowed_model(drafter, 200), "d")


# ----- loaded pairs ----------------------------------------------------------------------------------
def local_cfg(target: str, drafter: str) -> Config:
    return Config(
        target=ModelConfig(source=target, dtype="float32"),
        drafter=ModelConfig(source=drafter, dtype="float32"),
        speculation=SpeculationConfig(gamma=3),
    )


def greedy(pair, mode: str, ids: list[int]):
    engine = Engine.for_pair(pair, with_drafter=mode == "spec")
    return list(
        engine.stream(ids, SamplingConfig(temperature=0.0, max_new_tokens=24), SpeculationConfig(gamma=3, mode=mode))
    )[-1], engine


def test_a_loaded_pair_of_two_tokenizers_drafts_text_and_stays_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    ours, theirs = text_tokenizer(), text_tokenizer(OTHER_CORPUS, 200)
    target = save_dir(tmp_path / "target", build_model(len(ours), seed=1, layers=2), ours)
    drafter = save_dir(tmp_path / "foreign", build_model(len(theirs), seed=2, layers=1, hidden=32), theirs)
    pair = load_pair(local_cfg(str(target), str(drafter)))
    assert pair.pair_check.kind == "text" and len(pair.drafter_tokenizer) == len(theirs) != len(pair.tokenizer)
    ids = pair.tokenizer.encode("def reverse(lst):\n")
    spec, engine = greedy(pair, "spec", ids)
    assert isinstance(engine.drafter, TextDrafter) and spec.stats.drafted > 0
    assert list(spec.ids) == list(greedy(pair, "target", ids)[0].ids)
    assert "\n         · pair: different tokenizers (id 3 is " in banner(pair).plain  # the verdict, in the banner


def test_a_loaded_pair_of_one_tokenizer_drafts_ids(tmp_path, monkeypatch, tok):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    target = save_dir(tmp_path / "target", build_model(len(tok), seed=1, layers=2), tok)
    drafter = save_dir(tmp_path / "drafter", build_model(len(tok), seed=2, layers=1, hidden=32), tok)
    pair = load_pair(local_cfg(str(target), str(drafter)))
    assert pair.pair_check.kind == "same" and pair.drafter_tokenizer is None
    assert type(Engine.for_pair(pair).drafter) is ModelDrafter
