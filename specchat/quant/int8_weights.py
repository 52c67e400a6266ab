"""Weight-only int8 linear layers: half the bytes of bf16 per decoding step, torch's own CPU kernel.

A drafter decoding one token at a time on a CPU is bound by how fast it reads its weights, so
storing them as int8 (one scale per output row) nearly halves its forward time. Speculative
decoding stays exact with such a drafter: the target verifies every draft against the q the
quantized drafter really sampled from. Activations keep the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specchat.quant.shared import replace_linears


@dataclass
class Int8Block:
    """Symmetric per-output-row int8 weights [out, in], their float scales [out], and the row sums
    of the dequantized weights [out] (W · 1, which undoes the activations' centring)."""

    weight: torch.Tensor
    scale: torch.Tensor
    row_sums: torch.Tensor

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Block:
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        levels = (w / scale[:, None]).round_().clamp_(-127, 127)  # never in place: w may be the weight
        return cls(levels.to(torch.int8).contiguous(), scale, levels.sum(dim=1) * scale)

    @classmethod
    def concat(cls, blocks: list[Int8Block]) -> Int8Block:
        """The blocks' rows one after another: [sum of outs, in]."""
        return cls(
            torch.cat([b.weight for b in blocks]),
            torch.cat([b.scale for b in blocks]),
            torch.cat([b.row_sums for b in blocks]),
        )

    def rows(self, index: torch.Tensor | slice) -> Int8Block:
        return Int8Block(
            self.weight[index].contiguous(), self.scale[index].contiguous(), self.row_sums[index].contiguous()
        )


class Int8Linear(nn.Module):
    """y = x @ (w8 * scale).T + bias, with w8 int8 [out, in] and scale [out] in the input dtype."""

    def __init__(self, w8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("w8", w8)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = w8.shape[1], w8.shape[0]

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        """Symmetric per-row quantization of a float weight [out, in]."""
        block = Int8Block.quantize(weight)
        kept_bias = None if bias is None else bias.detach().clone()
        return cls(block.weight, block.scale.to(weight.dtype), kept_bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        return cls.from_weight(linear.weight, linear.bias)

    def rows(self, index: torch.Tensor | slice) -> Int8Linear:
        """A layer computing only the output rows `index` (a slice is a view, no copy)."""
        bias = None if self.bias is None else self.bias[index]
        return Int8Linear(self.w8[index].contiguous(), self.scale[index], bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scale = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
        if flat.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.w8, scale)
        else:  # no fused kernel assumed off the CPU: dequantize on the fly (correct, not fast)
            y = nn.functional.linear(flat, self.w8.to(x.dtype) * scale[:, None])
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantize_linears(model: nn.Module, blocks: dict[str, Int8Block] | None = None) -> dict[str, Int8Block]:
    """Replace every nn.Linear in `model` (the output head included) by an Int8Linear, from `blocks`
    (by module name) when given, else by quantizing its weights; returns the blocks used."""
    used: dict[str, Int8Block] = {}

    def build(name: str, linear: nn.Linear) -> Int8Linear:
        block = used[name] = blocks[name] if blocks is not None else Int8Block.quantize(linear.weight)
        kept_bias = None if linear.bias is None else linear.bias.detach().clone()
        device = linear.weight.device  # cached blocks are read onto the CPU
        return Int8Linear(block.weight.to(device), block.scale.to(device, linear.weight.dtype), kept_bias)

    replace_linears(model, build)
    return used
