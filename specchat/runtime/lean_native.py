"""The lean forward's decoder layers as one call into the compiled kernel module (lean_layers.cpp).

Where every linear layer of the decoder is a Q4Linear (w4a8) and the activations are float32,
lean.py's per-layer Python loop (about 75 torch calls a layer, each paying Python and dispatch time)
runs instead as one C++ call over all layers: the kernel's products, and plain loops between them
(norms, Qwen3's q/k norms per head, rotary, attention, SiLU). Each row takes the same steps whatever else is fed with it, so the
forward stays batch-invariant; its values are the Python loop's within float rounding (not bitwise:
its sums run in another order, its exp is its own). Anything else keeps the Python loop.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.w4a8 import TILE_ROWS, Q4Linear, whole_group
from specchat.runtime import architectures, fused

ACTIVATIONS = ("silu",)


def unsupported(layers: list[nn.Module], norm: nn.Module, config, dtype: torch.dtype, head_dim: int) -> str:
    """'' when build() can take these decoder layers and the norm after them, else why not."""
    reason = architectures.unsupported(config, architectures.COMPILED_RUNS, "the compiled layer loop")
    if reason:
        return reason
    if getattr(norm, "variance_epsilon", None) is None:
        return f"its final {type(norm).__name__} is not an RMSNorm"
    if dtype != torch.float32:
        return f"its activations are {dtype}, not float32"
    if getattr(config, "hidden_act", None) not in ACTIVATIONS:
        return f"its activation is {getattr(config, 'hidden_act', None)}, not silu"
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
        for norm in (layer.input_layernorm, layer.post_attention_layernorm, *_head_norms(attention)):
            if getattr(norm, "variance_epsilon", None) is None:
                return f"{type(norm).__name__} is not an RMSNorm"
    return ""


def _head_norms(attention: nn.Module) -> list[nn.Module]:
    """The RMSNorms over each head's query and key (Qwen3's q_norm, k_norm), or []."""
    norms = [getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)]
    return [norm for norm in norms if norm is not None]


def build(
    layer_type, layers: list[nn.Module], norm: nn.Module, heads: int, kv_heads: int, head_dim: int, scaling: float
):
    """A compiled LeanLayers (layer_type: the kernel module's class) over `layers` and the norm after them."""
    native = layer_type(heads, kv_heads, head_dim, scaling)
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = fused.qkv_layers(attention), fused.gate_up_layers(mlp)  # Phi-3: one layer each
        native.add_layer(
            layer.input_layernorm.weight,
            layer.post_attention_layernorm.weight,
            float(layer.input_layernorm.variance_epsilon),
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
            native.add_head_norms(
                q_norm.weight.detach().contiguous(), k_norm.weight.detach().contiguous(), float(q_norm.variance_epsilon)
            )
    native.set_final_norm(norm.weight.detach().contiguous(), float(norm.variance_epsilon))
    return native


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
