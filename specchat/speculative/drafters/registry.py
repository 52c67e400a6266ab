"""Every kind of drafter, one row each: the one table that settings validation, `/drafter`, `/help`, the drafter
race, the bench's `--drafters` and the docs read, and the engine's one way to build a drafter by name. A new kind
is its own file (the drafter and the function that builds it) and one row here.

A row's constructor is called with a DrafterSetup (the target, the drafter model's Drafter or None, the vocabulary
size) and the name's number (None where the kind takes none) and returns a Drafter, or raises DrafterUnusable with
one line for the user.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from specchat.config import Mode
from specchat.speculative.drafters import head, mixed, model, self_layers
from specchat.speculative.drafters.base import Drafter, DrafterSetup, DrafterUnusable

NAME = re.compile(r"([a-z][a-z0-9_-]*)(?::([1-9][0-9]{0,2}))?")  # a kind's name, and N from 1 to 999 (self:N)


@dataclass(frozen=True)
class DrafterKind:
    name: str
    help: str  # one line: what drafts
    build: Callable[[DrafterSetup, int | None], Drafter]
    argument: str = ""  # "N": the name takes a whole number from 1 after a colon (self:N); "": none
    default_argument: Callable[[DrafterSetup], int] | None = None  # the N a race tries where none is set
    needs_model: bool = False  # it drafts with the drafter model, so spec mode needs one loaded

    @property
    def usage(self) -> str:
        return f"{self.name}:{self.argument}" if self.argument else self.name


KINDS: list[DrafterKind] = [
    DrafterKind("model", "the drafter model", model.from_setup, needs_model=True),
    DrafterKind("lookup", "prompt lookup: a copy from the chat (no model)", mixed.lookup_from_setup),
    DrafterKind("auto", "a copy where the chat offers a match, else the model", mixed.auto_from_setup),
    DrafterKind("head", "a draft head trained for the target (specchat train-drafter)", head.from_setup),
    DrafterKind(
        "self",
        "the target's own first N layers draft, no second model",
        self_layers.from_setup,
        argument="N",
        default_argument=self_layers.quarter_of_layers,
    ),
]


def parse(name: object) -> tuple[DrafterKind, int | None] | None:
    """The kind a drafter name names and its number (None where the kind takes none); None for no kind's name."""
    if not isinstance(name, str):
        return None
    match = NAME.fullmatch(name)
    if match is None:
        return None
    kind = next((k for k in KINDS if k.name == match.group(1)), None)
    if kind is None or bool(kind.argument) != (match.group(2) is not None):
        return None
    return kind, int(match.group(2)) if match.group(2) else None


def usage() -> str:
    """The names as a command's usage says them: model|lookup|auto|head|self:N."""
    return "|".join(kind.usage for kind in KINDS)


def described() -> str:
    """What a drafter name must be, for a refused value's message."""
    names = [kind.usage + (f" ({kind.help})" if kind.argument else "") for kind in KINDS]
    return ", ".join(names[:-1]) + " or " + names[-1]


def problem(name: object) -> str | None:
    """What a drafter setting must be, where `name` names no kind; None where it does."""
    return None if parse(name) is not None else described()


def needs_model(name: str) -> bool:
    """Whether the named drafter drafts with the drafter model (an unknown name: no)."""
    parsed = parse(name)
    return parsed is not None and parsed[0].needs_model


def drafter_needed(has_drafter: bool, mode: Mode | str, compare: str = "off", drafter: str = "model") -> str | None:
    """Why a speculation mode (and compare setting, and drafter kind) cannot run without a drafter model;
    None when it can. Prompt lookup drafts with no model, but only in spec mode.

    The one place that decides it: loading, the CLI, the session, the commands and the engine ask here."""
    if has_drafter:
        return None
    if mode == Mode.DRAFTER or (mode == Mode.SPEC and needs_model(drafter)):
        return f"mode '{mode}' needs a drafter model"
    if compare == "drafter":
        return "compare 'drafter' needs a drafter model"
    return None


def build(name: str, setup: DrafterSetup) -> Drafter:
    """The drafter `name` names, built on `setup`; DrafterUnusable (one line) where it cannot draft here."""
    parsed = parse(name)
    if parsed is None:
        raise DrafterUnusable(f"no drafter named {name}: a drafter is {described()}")
    kind, argument = parsed
    if kind.needs_model and setup.model is None:
        raise DrafterUnusable(f"{name}: no drafter model is loaded")
    return kind.build(setup, argument)


def default_name(kind: DrafterKind, setup: DrafterSetup) -> str:
    """The kind's name with the number a race tries where none is set (self:N: a quarter of the layers)."""
    if kind.default_argument is None:
        return kind.name
    return f"{kind.name}:{kind.default_argument(setup)}"
