"""What the quantizers share: swapping a model's nn.Linear layers for quantized ones, finding the layers that
read one input (packed as one matrix, one product), and turning a product into a layer's output."""

from __future__ import annotations

import torch
from torch import nn


def replace_linears(model: nn.Module, build) -> int:
    """Replace every nn.Linear by build(name, linear); returns how many were replaced.

    A head tied to the input embeddings is untied: the embeddings keep their float weights.
    """
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                full = f"{parent_name}.{name}" if parent_name else name
                setattr(parent, name, build(full, child))
                replaced += 1
    return replaced


def name_of(model: nn.Module, module: nn.Module | None) -> str | None:
    """`module`'s qualified name inside `model` (model.named_modules' name), or None when it is not there."""
    return next((name for name, candidate in model.named_modules() if candidate is module), None)


SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # layers reading one input


def shared_input_groups(linears: dict[str, nn.Module], passes_of=lambda name: 1) -> list[list[str]]:
    """Names of the linear layers that read one input and can be packed as one matrix, by parent
    module: [[…q_proj, …k_proj, …v_proj], [gate_proj, up_proj], …], where passes_of(name) (the activation
    passes a layer takes, w8a8) is the same for all."""
    groups = []
    for name in linears:
        parent, _, leaf = name.rpartition(".")
        for leaves in SHARED_INPUTS:
            members = [f"{parent}.{other}" if parent else other for other in leaves]
            if (
                leaf == leaves[0]
                and all(member in linears for member in members)
                and len({passes_of(member) for member in members}) == 1
            ):
                groups.append(members)
    return groups


def layer_output(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """A quantized layer's output for input x from its product W x [rows, out] float32: bias, dtype, shape."""
    if bias is not None:
        y = y + bias
    return y.to(x.dtype).reshape(*x.shape[:-1], out_features)
