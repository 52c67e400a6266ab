"""The rotary tables the lean forward looks up, one row per position, from the model's own rotary module.

For most rope types (default, linear, Llama-3's, YaRN) a position's cos/sin do not depend on which other
positions are asked for with it, and the module is asked once for the cache's whole capacity. LongRoPE
(rope_type longrope: Phi-3-128k, Phi-3.5, Phi-4-mini) does: transformers' module takes its short factors for a
call whose last position is within original_max_position_embeddings, and its long factors for every position of a
call past it. Asked for a capacity past the original context at once, it would give every position the long
factors, and which factors a position got would hang on when the cache grew. Here a position takes the short
factors below original_max_position_embeddings and the long ones from there on: what transformers gives a
conversation fed a few tokens at a time (its cache keeps the keys it rotated with the short factors), and the
same whatever the capacity and however the rows are batched, so greedy speculation stays exact. (Only a single
call that crosses the original context, a long prompt at once, differs from transformers, which gives all of that
call's positions the long factors.)
"""

from __future__ import annotations

import torch
from torch import nn


def tables(
    rotary: nn.Module, probe: torch.Tensor, positions: torch.Tensor, layer_type: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, positions, head_dim] of positions [1, capacity] = 0 … capacity-1 (layer_type: which of the
    module's tables, for a module that keeps one per layer type, as Gemma-3's)."""

    def ask(wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary(probe, wanted) if layer_type is None else rotary(probe, wanted, layer_type)

    original = _longrope_context(rotary, layer_type)
    if original is None or positions.shape[-1] <= original:
        return ask(positions)
    short_cos, short_sin = ask(positions[..., :original])  # its last position within the original context
    long_cos, long_sin = ask(positions)  # past it: the long factors
    return (
        torch.cat([short_cos, long_cos[:, original:]], dim=1),
        torch.cat([short_sin, long_sin[:, original:]], dim=1),
    )


def _longrope_context(rotary: nn.Module, layer_type: str | None) -> int | None:
    """A LongRoPE module's original_max_position_embeddings (the last position + 1 its short factors are for);
    None for any other rope type."""
    kind = getattr(rotary, "rope_type", None)
    parameters = getattr(getattr(rotary, "config", None), "rope_parameters", None) or {}
    if isinstance(kind, dict):  # a table per layer type
        kind, parameters = kind.get(layer_type), parameters.get(layer_type) or {}
    if kind != "longrope":
        return None
    return int(parameters["original_max_position_embeddings"])
