"""Fused projections (the `fused_projections` need, architectures.py): Phi-3's attention computes q, k and v as one
linear layer (self_attn.qkv_proj, their rows end to end) and its MLP gate and up as one (mlp.gate_up_proj, gate's rows
first), where a Llama layer has a layer each. The lean forward and the compiled layer loop take a layer's projections
from here as a list of linears that read one input, whose outputs side by side are q|k|v (gate|up): three (two)
layers, or the one fused layer. A fused layer is one product whose output is split by views, so each row's values are
what the separate layers' would be, and as batch-invariant as its linear layer.
"""

from __future__ import annotations

import torch
from torch import nn


def qkv_layers(attention: nn.Module) -> list[nn.Module]:
    """The linears whose outputs side by side are an attention's queries, keys and values."""
    fused = getattr(attention, "qkv_proj", None)
    return [fused] if fused is not None else [attention.q_proj, attention.k_proj, attention.v_proj]


def gate_up_layers(mlp: nn.Module) -> list[nn.Module]:
    """The linears whose outputs side by side are a gated MLP's gate and up projections."""
    fused = getattr(mlp, "gate_up_proj", None)
    return [fused] if fused is not None else [mlp.gate_proj, mlp.up_proj]


def gate_width(mlp: nn.Module) -> int:
    """The width of the MLP's gate (and of its up projection, and of down_proj's input)."""
    fused = getattr(mlp, "gate_up_proj", None)
    return fused.out_features // 2 if fused is not None else mlp.gate_proj.out_features


def activation(mlp: nn.Module) -> nn.Module:
    """The MLP's activation module (Llama's act_fn, Phi-3's activation_fn)."""
    return mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn


def parts(outputs: list[torch.Tensor], widths: list[int]) -> list[torch.Tensor]:
    """The outputs of qkv_layers or gate_up_layers as one tensor per part `widths` wide: a fused layer's output split
    (views), separate layers' as they are."""
    if len(outputs) == len(widths):
        return outputs
    (fused,) = outputs
    if fused.shape[-1] != sum(widths):
        raise ValueError(f"a fused projection is {fused.shape[-1]} wide, not {' + '.join(map(str, widths))}")
    return list(fused.split(widths, dim=-1))
