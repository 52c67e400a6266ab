"""Drafters by name: the engine's one way to build one, from the table of kinds (specchat/drafter_kinds.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from specchat.drafter_kinds import DrafterKind, described, parse
from specchat.speculative.drafters.base import Drafter, DraftView
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler


class DrafterUnusable(ValueError):
    """A drafter name that cannot draft here; the message is one line for the user."""


@dataclass(frozen=True)
class DrafterSetup:
    """What a drafter kind's constructor may build on."""

    target: Model
    model: Drafter | None  # the drafter model's Drafter (None: no drafter model is loaded)
    vocab_size: int
    sampler: Sampler = TORCH_SAMPLER  # computes q: the engine's, the one its step computes p with
    view: DraftView = DraftView()  # what a drafter model reads and scores


Builder = Callable[[DrafterSetup, "int | None"], Drafter]


def _resolve(path: str) -> Callable[..., object]:
    module, _, function = path.partition(":")
    return cast(Callable[..., object], getattr(importlib.import_module(module), function))


def build(name: str, setup: DrafterSetup) -> Drafter:
    """The drafter `name` names, built on `setup`; DrafterUnusable (one line) where it cannot draft here."""
    parsed = parse(name)
    if parsed is None:
        raise DrafterUnusable(f"no drafter named {name}: a drafter is {described()}")
    kind, argument = parsed
    if kind.needs_model and setup.model is None:
        raise DrafterUnusable(f"{name}: no drafter model is loaded")
    return cast(Builder, _resolve(kind.build))(setup, argument)


def default_name(kind: DrafterKind, setup: DrafterSetup) -> str:
    """The kind's name with the number a race tries where none is set (self:N: a quarter of the layers)."""
    if not kind.argument:
        return kind.name
    return f"{kind.name}:{cast(Callable[[DrafterSetup], int], _resolve(kind.default_argument))(setup)}"
