"""The lean forward's decoder layers as one call into the compiled kernel module (lean_layers.cpp).

Where every linear layer of the decoder is a Q4Linear (w4a8) and the activations are float32,
lean.py's per-layer Python loop (about 75 torch calls a layer, each paying Python and dispatch time)
runs instead as one C++ call over all layers: the kernel's products, and plain loops between them
(norms, Qwen3's q/k norms per head, rotary, attention, SiLU; Gemma's 1 + w norms folded into their weights, its
norms after attention and MLP, GELU-tanh, soft-capped scores, sliding windows, a rotary table per layer). Each row
takes the same steps whatever else is fed with it, so the forward stays batch-invariant; its values are the Python loop's within float rounding (not bitwise:
its sums run in another order, its exp is its own). Anything else keeps the Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specchat.quant.q4_tiles import TILE_ROWS
from specchat.quant.w4a8 import Q4Linear, whole_group
from specchat.runtime import architectures, fused

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # the config's name: the kernel's


def unsupported(layers: list[nn.Module], norm: nn.Module, config, dtype: torch.dtype, head_dim: int) -> str:
    """'' when build() can take these decoder layers and the norm after them, else why not."""
    reason = architectures.unsupported(config, architectures.COMPILED_RUNS, "the compiled layer loop")
    if reason:
        return reason
    if _eps(norm) is None:
        return f"its final {type(norm).__name__} is not an RMSNorm"
    if dtype != torch.float32:
        return f"its activations are {dtype}, not float32"
    if _activation(config) not in ACTIVATIONS:
        return f"its activation is {_activation(config)}, not silu or gelu_pytorch_tanh"
    if head_dim % 16 or config.hidden_size % 8 or config.intermediate_size % 8:
        return "its head size is not a multiple of 16, or its widths not of 8"
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        linears = [*fused.qkv_layers(attention), attention.o_proj, *fused.gate_up_layers(mlp), mlp.down_proj]
        if not all(isinstance(linear, Q4Linear) for linear in linears):
            return "not every linear layer is w4a8"
        if any(linear.out_features % TILE_ROWS for linear in linears):
            return f"a layer's width is not a multiple of {TILE_ROWS}"
        if sum(linear.out_features for linear in fused.gate_up_layers(mlp)) != 2 * fused.gate_width(mlp):
            return "its gate and up projections differ in width"
        if len(_head_norms(attention)) == 1:
            return "it norms the heads of only one of query and key"
        for norm in (*_layer_norms(layer), *_head_norms(attention)):
            if _eps(norm) is None:
                return f"{type(norm).__name__} is not an RMSNorm"
    return ""


def _head_norms(attention: nn.Module) -> list[nn.Module]:
    """The RMSNorms over each head's query and key (Qwen3's q_norm, k_norm), or []."""
    norms = [getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)]
    return [norm for norm in norms if norm is not None]


@dataclass(frozen=True)
class Attention:
    """What a model's layers add to a Llama layer's attention, as lean.py reads it: per layer, the keys it reads
    (a sliding window; None: all) and which of the forward's rotary tables it takes; the scores' soft-cap (Gemma-2)."""

    windows: tuple[int | None, ...] = ()
    rope_tables: tuple[int, ...] = ()
    softcap: float | None = None


def build(
    layer_type,
    layers: list[nn.Module],
    norm: nn.Module,
    heads: int,
    kv_heads: int,
    head_dim: int,
    scaling: float,
    config=None,
    attention_parts: Attention = Attention(),
):
    """A compiled LeanLayers (layer_type: the kernel module's class) over `layers` and the norm after them; config:
    the model's (its activation, Gemma's 1 + w norms)."""
    offset = config is not None and "norm_offset" in (architectures.model_needs(config) or ())
    native = layer_type(heads, kv_heads, head_dim, scaling)
    if config is not None:
        native.set_activation(ACTIVATIONS[_activation(config)])
    native.set_softcap(attention_parts.softcap or 0.0)
    for index, layer in enumerate(layers):
        attention, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = fused.qkv_layers(attention), fused.gate_up_layers(mlp)  # Phi-3: one layer each
        before_attention, before_mlp, *after = _layer_norms(layer)
        native.add_layer(
            _weight(before_attention, offset),
            _weight(before_mlp, offset),
            _eps(before_attention),
            _parts(qkv),
            _bias(qkv),
            list(attention.o_proj.tiles.tensors()),
            _bias([attention.o_proj]),
            _parts(gate_up),
            _bias(gate_up),
            fused.gate_width(mlp),
            list(mlp.down_proj.tiles.tensors()),
            _bias([mlp.down_proj]),
        )
        head_norms = _head_norms(attention)
        if head_norms:
            q_norm, k_norm = head_norms
            native.add_head_norms(_weight(q_norm, offset), _weight(k_norm, offset), _eps(q_norm))
        if after:  # Gemma: its attention's and its MLP's outputs normed before their residual adds
            native.add_sandwich_norms(*(_weight(after_norm, offset) for after_norm in after))
        windows, tables = attention_parts.windows, attention_parts.rope_tables
        native.set_layer_attention((windows[index] if windows else None) or 0, tables[index] if tables else 0)
    native.set_final_norm(_weight(norm, offset), _eps(norm))
    return native


def _activation(config) -> str | None:
    """The MLP's activation as the config names it (Gemma's hidden_activation, else hidden_act)."""
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _layer_norms(layer: nn.Module) -> list[nn.Module]:
    """A layer's norms: before attention and before the MLP, then (Gemma's sandwich) after attention and after the
    MLP."""
    sandwich = getattr(layer, "pre_feedforward_layernorm", None)
    if sandwich is None:
        return [layer.input_layernorm, layer.post_attention_layernorm]
    return [layer.input_layernorm, sandwich, layer.post_attention_layernorm, layer.post_feedforward_layernorm]


def _eps(norm: nn.Module) -> float | None:
    """An RMSNorm's epsilon (Llama's variance_epsilon, Gemma's eps), None for any other module."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None and type(norm).__name__.endswith("RMSNorm"):
        eps = getattr(norm, "eps", None)
    return None if eps is None else float(eps)


def _weight(norm: nn.Module, offset: bool) -> torch.Tensor:
    """The float32 vector an RMSNorm's normed rows are multiplied by: its weight, or (offset: Gemma's) 1 + weight,
    rounded once to float32 exactly as transformers' Gemma norm computes it."""
    weight = norm.weight.detach()
    return (1.0 + weight.float()).contiguous() if offset else weight.contiguous()


def _parts(linears: list[Q4Linear]) -> list[list[torch.Tensor]]:
    """The kernel calls for linears that read one input: their group's fused weights when they are
    exactly one Q4Group, in order; else each layer's own."""
    group = whole_group(linears)
    if group is not None:
        return [list(group.fused.tensors())]
    return [list(linear.tiles.tensors()) for linear in linears]


def _bias(linears: list[Q4Linear]) -> torch.Tensor | None:
    """The linears' biases end to end (zeros for a layer without one), or None when none has one."""
    if all(linear.bias is None for linear in linears):
        return None
    return torch.cat(
        [linear.bias if linear.bias is not None else torch.zeros(linear.out_features) for linear in linears]
    )
