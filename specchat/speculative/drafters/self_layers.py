"""The self drafter (`self:N`): the target's own first N layers, then its final norm and head, draft
for the whole target (LayerSkip-style self-speculation; transformers' `assistant_early_exit`).

It shares every weight with the target, so it costs no memory beyond its own KV cache and needs no
second model. It runs through the same ModelDrafter as a drafter model, with a cache of its own. How
well a model drafts for itself from an early layer depends on the model: ones trained for early exit
(LayerSkip) do well; others accept less, which `/compare drafters` shows.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from specchat.speculative import model_io
from specchat.speculative.drafters.base import DrafterSetup, DrafterUnusable, DraftView
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.sampling import TORCH_SAMPLER, Sampler


def layer_count(model: model_io.Model) -> int:
    return len(model.get_decoder().layers)


def check_self_layers(model: model_io.Model, n: int) -> str | None:
    """Why `self:n` cannot draft for `model`; None when it can."""
    total = layer_count(model)
    if not 1 <= n < total:
        return f"self:{n}: the target has {total} layers, so N must be from 1 to {total - 1}"
    return None


def truncated_model(model: model_io.Model, n: int) -> model_io.Model:
    """A view of `model` that runs only its first n decoder layers (layers_view)."""
    return layers_view(model, list(range(n)))


def layers_view(model: model_io.Model, keep: list[int]) -> model_io.Model:
    """A view of `model` that runs only its decoder layers `keep`, in that order: new module objects around the
    same layers, norm, embeddings and head (no weight is copied), with a config that says len(keep) layers.
    One that skips a layer runs on the lean forward only: transformers' cache finds a layer by its own index."""
    if keep != list(range(len(keep))) and model_io.runner(model) is None:
        raise ValueError("a view that skips layers runs on the lean forward only (runtime/lean.py)")
    config = copy.copy(model.config)
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[index] for index in keep]
    layers = list(model.get_decoder().layers)
    decoder = copy.copy(model.get_decoder())
    decoder._modules = dict(decoder._modules)
    decoder.layers = nn.ModuleList([layers[index] for index in keep])
    decoder.config = config
    view: Any = copy.copy(model)  # an nn.Module whose own _modules and __dict__ are replaced below
    view._modules = dict(view._modules)
    view.__dict__.pop(model_io.RUNNER, None)  # the target's own forward runs all its layers
    setattr(view, _decoder_attribute(model), decoder)
    view.config = config
    own = model_io.runner(model)
    if own is not None:
        setattr(view, model_io.RUNNER, own.for_view(view))
    viewed: model_io.Model = view
    return viewed


def _decoder_attribute(model: Any) -> str:
    """The name of the decoder among the model's children (an nn.Module's)."""
    decoder = model.get_decoder()
    return next(str(name) for name, module in model.named_children() if module is decoder)


def self_drafter(
    model: model_io.Model, n: int, vocab_size: int, sampler: Sampler = TORCH_SAMPLER, view: DraftView = DraftView()
) -> ModelDrafter:
    return ModelDrafter(truncated_model(model, n), vocab_size, sampler, view)


def from_setup(setup: DrafterSetup, n: int | None) -> ModelDrafter:
    """The `self:N` row's constructor (drafters/registry.py)."""
    n = quarter_of_layers(setup) if n is None else n
    problem = check_self_layers(setup.target, n)
    if problem:
        raise DrafterUnusable(problem)
    return self_drafter(setup.target, n, setup.vocab_size, setup.sampler, setup.view)


def quarter_of_layers(setup: DrafterSetup) -> int:
    """The N a drafter race tries where no self:N is set: a quarter of the target's layers."""
    return max(1, layer_count(setup.target) // 4)
