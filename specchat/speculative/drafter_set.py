"""The drafters an engine holds: the drafter model's, each other kind built by its name on first use
(drafters/registry.py), the view they draft with, and which one drafts now."""

from __future__ import annotations

from specchat.config import Mode, SpeculationConfig
from specchat.speculative.drafters.base import CachedDrafter, Drafter, DrafterSetup, DrafterUnusable, DraftView
from specchat.speculative.drafters.registry import build
from specchat.speculative.model_io import Model
from specchat.speculative.sampling import Sampler


class DrafterSet:
    def __init__(
        self, target: Model, model: CachedDrafter | None, eos_ids: frozenset[int], vocab_size: int, sampler: Sampler
    ) -> None:
        self.target, self.eos_ids, self.vocab_size, self.sampler = target, eos_ids, vocab_size, sampler
        self.model = model  # the drafter model's, which fork() copies (None: no drafter model)
        self.name: str | None = "model" if model is not None else None  # the one that drafts
        self.view = model.view if model is not None else DraftView(always_ids=eos_ids)
        self.built: dict[str, Drafter] = {}  # by name, each built on first use

    def fork(self) -> DrafterSet:
        """The same kinds on the same models, with caches of their own and none built yet."""
        model = self.model.fresh(self.model.view) if self.model is not None else None
        return DrafterSet(self.target, model, self.eos_ids, self.vocab_size, self.sampler)

    @property
    def setup(self) -> DrafterSetup:
        """What a drafter kind builds on (drafters/registry.py)."""
        return DrafterSetup(self.target, self.model, self.vocab_size, self.sampler, self.view)

    @property
    def current(self) -> Drafter | None:
        """The drafter that drafts (built by its name on first use); None before any has, with no drafter model."""
        return self.named(self.name) if self.name is not None else None

    def named(self, name: str) -> Drafter:
        """built[name], built on first use by its kind's row (a self:N drafter shares the target's weights)."""
        if name not in self.built:
            self.built[name] = build(name, self.setup)
        return self.built[name]

    def problem(self, name: str) -> str | None:
        """Why drafter `name` cannot draft here (no kind's name, no drafter model for it, a self:N with N out of
        range); None where it can."""
        try:
            self.named(name)
        except DrafterUnusable as err:
            return str(err)
        return None

    def use(self, name: str) -> None:
        """Make built[name] the one that drafts. It starts from an empty cache: what it cached when it last drafted
        may belong to another conversation."""
        chosen = self.named(name)
        if chosen is not self.current:
            chosen.reset()
            self.name = name

    def use_view_of(self, speculation: SpeculationConfig) -> None:
        """Draft with the view the settings ask of a drafter model (drafter mode: the drafter's view of everything);
        a new view builds the drafters anew on the same models (their caches too)."""
        context = 0 if speculation.mode == Mode.DRAFTER else speculation.drafter_context
        view = DraftView(speculation.drafter_vocab, self.eos_ids, speculation.prompt_lookup, context)
        if view == self.view:
            return
        self.view = view
        self.model = self.model.fresh(view) if self.model is not None else None
        self.built = {}

    def reset(self) -> None:
        """Forget what every drafter cached."""
        held = [*self.built.values(), *([self.model] if self.model is not None else [])]
        for drafter in {id(d): d for d in held}.values():
            drafter.reset()
