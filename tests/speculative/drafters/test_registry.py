"""Drafters by name from one table (speculative/drafters/registry.py): a new kind is its own code and one row.

The toy kind below is this file's code (a drafter that proposes the newest token again) and one row added to
the table; with nothing else changed, the settings take its name, `/drafter` and `/help` offer it, the drafter
race runs it, and its greedy replies are the target's own."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import GREEDY, hf_greedy, make_engine, prompt_ids

from specchat.config import ConfigError, SpeculationConfig
from specchat.settings import load_config
from specchat.speculative.drafters import registry as kinds
from specchat.speculative.drafters.base import DrafterSetup, DrafterUnusable
from specchat.speculative.drafters.copies import copy_draft
from specchat.speculative.drafters.registry import DrafterKind, build

PROMPT = "def add(a, b):"


class EchoDrafter:
    """Proposes the newest committed token `plan.gamma` times (one-hot q: exact whatever it proposes)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def propose(self, ids, plan, sampling, generator):
        draft = copy_draft([ids[-1]] * plan.gamma, sampling, self.vocab_size)
        return dataclasses.replace(draft, source="model")  # auto gamma learns its alpha and c as a model's

    def observe(self, ids, read=0, target=None) -> int:
        return 0  # it keeps no cache

    def reset(self) -> None: ...


def echo_from_setup(setup: DrafterSetup, _: int | None) -> EchoDrafter:
    return EchoDrafter(setup.vocab_size)


@pytest.fixture
def echo_kind(monkeypatch):
    """The one row a new kind adds."""
    row = DrafterKind("echo", "the newest token again", echo_from_setup)
    monkeypatch.setattr(kinds, "KINDS", [*kinds.KINDS, row])
    return row


def test_a_new_kind_is_its_code_and_one_row(echo_kind, target, tokenizer):
    from specchat.config import Config
    from specchat.session.chat import ChatSession
    from specchat.session.drafter_race import contenders
    from specchat.tui.commands import build_registry

    assert load_config(None, ["speculation.drafter=echo"]).speculation.drafter == "echo"
    engine = make_engine(target, None, tokenizer)
    ids = prompt_ids(tokenizer, PROMPT)
    done = [e for e in engine.stream(ids, GREEDY, SpeculationConfig(gamma=3, drafter="echo"))][-1]
    assert done.stats.drafted > 0 and done.stats.drafter == "echo"
    assert list(done.ids) == hf_greedy(target, ids, GREEDY.max_new_tokens)[: len(done.ids)]  # exact
    assert "echo" in contenders(engine, "model")
    session = ChatSession(engine, tokenizer, Config(sampling=GREEDY), 1024)
    registry = build_registry()  # the commands are built from the table as it is now
    assert not registry.run(session, "/drafter echo").error
    assert "echo, the newest token again" in registry.run(session, "/help drafter").message


def test_names_the_table_does_not_hold_are_refused_in_one_line(target, tokenizer):
    for bad in ("echo", "self", "model:2", "self:0", "self:1000", "Model", ""):
        with pytest.raises(ConfigError, match="model, lookup, auto, head or self:N"):
            load_config(None, [f"speculation.drafter={bad}"])
    setup = DrafterSetup(target, None, len(tokenizer))
    with pytest.raises(DrafterUnusable, match="no drafter model is loaded"):
        build("model", setup)
    with pytest.raises(DrafterUnusable, match="no drafter named echo"):
        build("echo", setup)


def test_every_row_builds_from_its_constructor(head_on_target, target, similar_drafter_model, tokenizer):
    engine = make_engine(target, similar_drafter_model, tokenizer)
    for kind in kinds.KINDS:
        name = kind.name + (":1" if kind.argument else "")
        assert engine.drafter_problem(name) is None, name
        assert engine.drafters.built[name] is not None
    assert engine.drafters.built["model"] is build(
        "model", engine.drafters.setup
    )  # the pair's own drafter, not another


def test_the_docs_list_every_kind():
    from pathlib import Path

    docs = Path(__file__).parents[3] / "docs"
    commands, config = (docs / "commands.md").read_text(), (docs / "config.md").read_text()
    for kind in kinds.KINDS:
        assert f"`{kind.usage}`" in config and kind.usage in commands, kind.usage
    assert kinds.usage() in commands.replace("\\|", "|")
