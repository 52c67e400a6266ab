"""4-bit weights × 8-bit activations (`quantization = "w4a8"`): a quarter of bf16's bytes per step,
a kernel whose cost grows slowly from 1 to gamma+1 rows, and a result per row that never depends on
the other rows of its batch.

Why: decoding on a CPU reads every weight once per forward, so the bytes per step decide. 4-bit
weights in groups of 32 (a scale and an offset each, as llama.cpp's Q4_K) read about 0.6 of int8's.
The activations are mapped per row and per block of 256 (or 128, 64) inputs onto int8, so the dot
products are integer, exact, and the same whatever else the batch holds: greedy speculative output
equals greedy target-only output in the dtype the chat runs.

Here: Q4Linear, the layer that runs them; quantize_w4a8, which puts it in a model's place; Q4Group, layers
reading one input fused into one kernel call. Q4Block (q4_block.py) is the weights' stored form (a row after
a row, levels packed as q4_levels.py says); the kernel reads them as Q4Tiles (q4_tiles.py), 16 output rows
interleaved so that each lane of a vector is one output row (layout: q4_tiles.h), repacked once at load.
The kernel (kernels/q4/: q4_kernel.cpp and its code paths, q4_path_*.cpp) is compiled once with the
machine's C++ compiler into specchat's cache, and picks its path at run time from what the CPU has.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.memory import FreedPages
from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_levels import GROUP, PAIR
from specchat.quant.q4_tiles import TILE_ROWS, Q4Tiles
from specchat.quant.shared import layer_output, replace_linears, shared_input_groups

FINER_BITS = 6  # levels of the layers kept finer than 4 bits (a GGUF's Q6_K..., the head)
RETURN_EVERY = 64 << 20  # bytes of fused layers' own tiles let go between handing the heap's free pages back


def fits(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape: its input width a multiple of 64 (levels are
    stored in pairs of 32-groups)."""
    return linear.in_features % PAIR == 0


def fitting_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's nn.Linear layers the kernel takes, by module name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear) and fits(module)}


def run_kernel(product, x: torch.Tensor, tiles: Q4Tiles) -> torch.Tensor:
    """The kernel's W x [rows, out] float32 for x [rows, in] float32 (one place to time it)."""
    return product(x, *tiles.tensors(), tiles.outs)


class Q4Linear(nn.Module):
    """A drop-in nn.Linear: 4-bit weights, 8-bit activations per row and block, float32 products."""

    def __init__(self, block: Q4Block | Q4Tiles, bias: torch.Tensor | None, product):
        """product: the kernel's q4_linear (a builtin function, so the layer can be deep-copied)."""
        super().__init__()
        self.tiles = block if isinstance(block, Q4Tiles) else Q4Tiles.from_block(block)
        self.product = product
        self.group: tuple[Q4Group, int] | None = None  # set by Q4Group when fused with its neighbours
        self.out_features = self.tiles.outs
        self.in_features = self.tiles.sc.shape[1] * GROUP
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(run_kernel(self.product, x.reshape(-1, self.in_features).float(), self.tiles), x)

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return layer_output(y, x, self.bias, self.out_features)

    def rows(self, index: torch.Tensor | slice) -> Q4Linear:
        """A layer computing only the output rows `index`."""
        return Q4Linear(self.tiles.rows(index), None if self.bias is None else self.bias[index], self.product)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, 4-bit weights × 8-bit activations"


def quantize_w4a8(
    model: nn.Module,
    blocks: dict[str, Q4Tiles] | None,
    kernel,
    exact: dict[str, Q4Block] | None = None,
    finer_bits: int = FINER_BITS,
) -> dict[str, Q4Tiles]:
    """Replace every nn.Linear of `model` (the head too) whose shape the kernel takes (`fits`) by a
    Q4Linear; returns the tiles used (what the stored weights hold). The others stay as they are.

    From `blocks` (by module name; each taken out of the dict as it is used) when given. Else a layer takes
    its block from `exact` (a GGUF's own blocks: the file's weights bit for bit) or is quantized from its
    weights: with `finer_bits` levels when `exact` is given (the file kept that layer finer than 4 bits) or
    when it is the output head, else 4 bits. finer_bits = 4 makes every layer 4-bit (w4a8-fast).
    `kernel`: build_kernel's module."""
    used: list[str] = []

    def bits_for(name: str) -> int:
        return finer_bits if exact is not None or name == "lm_head" else 4

    def build(name: str, linear: nn.Linear) -> nn.Module:
        if not fits(linear):
            return linear
        if blocks is not None:
            block = blocks.pop(name)  # not held here: a fused layer's own tiles are freed as its group is made
        else:
            block = (exact or {}).get(name) or Q4Block.quantize(linear.weight, bits_for(name))
        layer = Q4Linear(block, linear.bias, kernel.q4_linear)
        used.append(name)
        return layer

    linears = fitting_linears(model)
    replace_linears(model, build)
    freed = FreedPages(RETURN_EVERY)
    for names in shared_input_groups(linears, lambda name: 1):
        freed.let_go(
            group_layers(model, names)
        )  # a group's own tiles are freed as it is fused (nothing else holds them)
    return {name: model.get_submodule(name).tiles for name in used}  # a fused layer's: a view of its rows


class Q4Group:
    """Layers that read one input (q/k/v, gate/up) as one matrix: one kernel call gives every
    layer's product, bitwise the same as each layer's own (every output is a dot product of its own).
    The layers' tiles become views of the fused tiles, so the weights are held once."""

    def __init__(self, layers: list[Q4Linear]):
        self.widths = [layer.out_features for layer in layers]
        own = [layer.tiles for layer in layers]
        self.fused = Q4Tiles.concat(own, outs=sum(self.widths))
        self.copied = self.fused.qs.data_ptr() != own[0].qs.data_ptr()  # not views of tiles side by side already
        self.product = layers[0].product
        start = 0
        for index, layer in enumerate(layers):
            layer.tiles = self.fused.rows(slice(start, start + layer.out_features))  # whole tiles: views
            layer.group, start = (self, index), start + layer.out_features

    def products(self, x: torch.Tensor) -> list[torch.Tensor]:
        """W x of every layer, float32 [rows, width], from x [rows, in] float32, in the layers' order."""
        return list(run_kernel(self.product, x, self.fused).split(self.widths, dim=1))


def group_layers(model: nn.Module, names: list[str]) -> int:
    """Fuse the Q4Linear layers `names` of `model`, which read one input, into a Q4Group, where their
    levels are stored alike (as many bits, same block width) and each fills whole tiles. Returns the bytes of the
    layers' own tiles it let go (0: not fused, or fused in place: tiles read side by side, tile_arena.py)."""
    layers = [model.get_submodule(name) for name in names]
    if not all(isinstance(layer, Q4Linear) for layer in layers):
        return 0
    tiles = [layer.tiles for layer in layers]
    alike = len({(t.qs.shape[2], t.qs.dtype, t.sc.dtype, t.d.shape[1]) for t in tiles}) == 1  # one layout
    if not alike or any(layer.out_features % TILE_ROWS for layer in layers):
        return 0
    group = Q4Group(layers)
    return sum(t.nbytes for part in tiles for t in part.tensors()) if group.copied else 0


def whole_group(layers: list[Q4Linear]) -> Q4Group | None:
    """The Q4Group made of exactly these layers, in this order; None when they are not one."""
    group = getattr(layers[0], "group", None)
    if group is None or len(layers) != len(group[0].widths):
        return None
    same = all(getattr(layer, "group", None) == (group[0], index) for index, layer in enumerate(layers))
    return group[0] if same else None


def same_input(layers: list[Q4Linear], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of Q4Linear layers that all read x: a whole Q4Group's in one kernel call."""
    group = whole_group(layers)
    if group is None:
        return [layer(x) for layer in layers]
    products = group.products(x.reshape(-1, layers[0].in_features).float())
    return [layer.finish(product, x) for layer, product in zip(layers, products)]
