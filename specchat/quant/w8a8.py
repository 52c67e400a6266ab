"""int8 weights × int8 activations: a linear layer whose cost grows slowly from 1 to about 8 rows,
and whose result for a row never depends on the other rows in the batch.

Why: with weight-only kernels, verifying gamma+1 drafted tokens costs about 3× a one-token step on a
CPU; fbgemm's int8×int8 kernel (VNNI) reads half the bytes of bf16 and multiplies 8 rows for well
under twice the time of one. But fbgemm quantizes
the activations with one range for the whole batch, so a row's result would depend on its batch,
and speculative output would differ from target-only output. The fix here: map every row affinely
onto [−1, 1] (centre c, half-range h per row) and append two constant rows, +1 and −1, so the
kernel's per-tensor range is always exactly [−1, 1]; then undo the map:
    W x = h · (W x̂) + c · (W · 1),   x̂ = (x − c) / h.
Every step is per row or per element, so the layer is batch-invariant bitwise.

Activations have outlier channels (LLM.int8(), SmoothQuant), worst at the input of the MLP's output
projection, where a row spans about 2,500× from peak to median. A second pass multiplies each row's
rounding residual with a range of its own: about 16-bit activations (see activation_passes for which
layers take it). Both passes' rows go through one kernel call, so the weights are still read once.
Layers that read one input (q/k/v, gate/up) are packed as one matrix (SharedInput). A fixed, calibrated set of outlier channels
multiplied apart measured no better than the second pass, and cost 196 more kernel calls a step.

torch's quantized ops live in this module only, so the kernel can be swapped in one place.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from specchat.quant.int8_weights import Int8Block
from specchat.quant.shared import layer_output, replace_linears, shared_input_groups


def _pack(weight: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed form of int8 weights [out, in] with per-row scales."""
    with warnings.catch_warnings():  # torch.ao's quantized tensors warn of their planned removal
        warnings.simplefilter("ignore")
        qweight = torch._make_per_channel_quantized_tensor(
            weight, scale.double(), torch.zeros(weight.shape[0], dtype=torch.long), 0
        )
        return torch.ops.quantized.linear_prepack(qweight, None)


PACK_ROWS = 8192  # fbgemm packs 8k-row pieces 3× faster than a 152k-row head, and runs them as fast


def pack_rows(block: Int8Block) -> list:
    """The block's weights packed in pieces of at most PACK_ROWS output rows."""
    rows = block.weight.shape[0]
    return [
        _pack(block.weight[start : start + PACK_ROWS], block.scale[start : start + PACK_ROWS])
        for start in range(0, rows, PACK_ROWS)
    ]


def has_vnni() -> bool:
    """Whether the CPU multiplies int8 with AVX512-VNNI. Without it fbgemm sums pairs of u8×s8
    products into saturating int16 (`maddubs`): 8-bit activations overflow there, 7-bit ones do not."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            return any("avx512_vnni" in line.split() for line in info if line.startswith("flags"))
    except OSError:
        return False


_REDUCE_RANGE = not has_vnni()  # 7-bit activations where 8-bit ones would saturate (the x86 default)
_KERNEL_LEVELS = 127 if _REDUCE_RANGE else 255


def _int8_product(x: torch.Tensor, packed) -> torch.Tensor:
    """fbgemm's dynamic int8×int8 linear: 8-bit activations with VNNI, else 7-bit (no saturation)."""
    return torch.ops.quantized.linear_dynamic(x, packed, _REDUCE_RANGE)


_STEP = torch.tensor(2.0) / _KERNEL_LEVELS  # the kernel's activation step once the tensor's range is [−1, 1]
_LEVELS = float(_KERNEL_LEVELS // 2)  # each row spans ±127 (7-bit: ±63) of those steps, on the grid


_BOUNDS: dict[int, torch.Tensor] = {}  # by input width: the two constant rows +1 and −1


def _bounds(width: int) -> torch.Tensor:
    if width not in _BOUNDS:
        _BOUNDS[width] = torch.tensor([[1.0], [-1.0]]).expand(2, width)
    return _BOUNDS[width]


def _on_grid(x: torch.Tensor, rounded: bool):
    """Each row of x as centre + scale · unit with unit within ±127 steps of the kernel's grid:
    (unit, scale, centre, levels), where levels are the rounded steps when `rounded`."""
    low, high = torch.aminmax(x, dim=1, keepdim=True)
    centre = (high + low) * 0.5
    step = ((high - low) * (0.5 / _LEVELS)).clamp_(min=1e-30)  # a row spans ±_LEVELS steps
    levels = (x - centre).div_(step)
    levels = levels.round_().clamp_(-_LEVELS, _LEVELS) if rounded else levels.clamp_(-_LEVELS, _LEVELS)
    return levels * _STEP, step / _STEP, centre, (levels, step)


@dataclass
class MappedRows:
    """x [M, in] mapped for the kernel: every pass's rows stacked in one batch, so the weights are
    read once however many passes there are (the kernel's result for a row does not depend on its
    batch, so this is bitwise the same as one kernel call per pass)."""

    rows: torch.Tensor  # [passes*M + 2, in]: pass 1's rows, pass 2's rows, then +1 and −1
    scales: torch.Tensor  # [passes, M, 1]
    centres: torch.Tensor  # [passes, M, 1]

    @property
    def passes(self) -> int:
        return self.scales.shape[0]


def map_rows(x: torch.Tensor, passes: int) -> MappedRows:
    """x [M, in] float32 → its rows on the kernel's grid, once per pass.

    One pass: the kernel rounds; ±127 steps land exactly on its grid's ends. Two passes: each row is
    first snapped to 255 levels of its own range, on exactly the grid the kernel quantizes to, so what
    the kernel multiplies is known; the rounding residual of every row then gets a range of its own.
    """
    unit, scale, centre, (levels, step) = _on_grid(x, rounded=passes > 1)
    if passes == 1:
        return MappedRows(torch.cat([unit, _bounds(x.shape[1])]), scale[None], centre[None])
    residual = x - centre - levels * step  # what the rounding lost, per element
    unit_2, scale_2, centre_2, _ = _on_grid(residual, rounded=False)
    return MappedRows(
        torch.cat([unit, unit_2, _bounds(x.shape[1])]), torch.stack([scale, scale_2]), torch.stack([centre, centre_2])
    )


class FixedRangeProduct:
    """x [M, in] float32 → W x [M, out] float32 through the int8×int8 kernel, batch-invariant.

    `passes=2` gives about 16-bit activations, for heavy-tailed inputs (the MLP, the head); see map_rows.
    """

    def __init__(self, block: Int8Block, passes: int = 1, packs: list | None = None):
        self._packs = packs if packs is not None else pack_rows(block)
        self.row_sums = block.row_sums
        self.passes = passes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(map_rows(x, self.passes))

    def apply(self, mapped: MappedRows) -> torch.Tensor:
        """W x from map_rows(x, passes): one kernel call for every pass, the passes' parts summed in
        order. Each row's part is x = centre + scale · unit undone: W x = scale · (W unit) + centre · (W 1)."""
        rows = mapped.rows.shape[0] - 2
        product = self._kernel(mapped.rows)[:rows].view(mapped.passes, rows // mapped.passes, -1)
        parts = torch.addcmul(mapped.centres * self.row_sums, product, mapped.scales)  # [passes, M, out]
        return parts[0] if mapped.passes == 1 else parts[0] + parts[1]

    def _kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel's W·rows for every row fed [rows, out], over the packed pieces of W."""
        if len(self._packs) == 1:
            return _int8_product(rows, self._packs[0])
        return torch.cat([_int8_product(rows, packed) for packed in self._packs], dim=1)


class SharedInput:
    """Linear layers that read one input (q/k/v, gate/up), packed as one matrix: one mapping of the
    input's rows and one kernel call give every layer's product, bitwise the same as each layer's
    own (every output column is a dot product of its own). Called one layer at a time (transformers'
    modules), the products of an input are kept only until every layer has taken its own."""

    def __init__(self, block: Int8Block, widths: list[int], passes: int, packs: list | None = None):
        """block: the layers' Int8Blocks concatenated (Int8Block.concat); widths: their out_features."""
        self.widths, self.in_features, self.passes = widths, block.weight.shape[1], passes
        self._product = FixedRangeProduct(block, passes, packs)
        self._input, self._parts, self._waiting = None, [], set()

    def products(self, x: torch.Tensor) -> list[torch.Tensor]:
        """W x of every layer, float32 [rows of x, width], without biases, in the order of the layers."""
        return list(self._product(x.reshape(-1, self.in_features).float()).split(self.widths, dim=1))

    def product(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Layer `index`'s W x, computed with the others' on the first call for x."""
        if self._input is not x or index not in self._waiting:
            self._input, self._parts, self._waiting = x, self.products(x), set(range(len(self.widths)))
        self._waiting.discard(index)
        part = self._parts[index]
        if not self._waiting:
            self._input, self._parts = None, []
        return part


class W8A8Linear(nn.Module):
    """A drop-in nn.Linear: int8 weights per output row, int8 activations per row, float32 out.
    A layer in a SharedInput group computes through the group (its weights are packed there)."""

    def __init__(
        self,
        block: Int8Block,
        bias: torch.Tensor | None,
        passes: int = 1,
        packs: list | None = None,
        group: tuple[SharedInput, int] | None = None,
    ):
        super().__init__()
        self.block, self.passes = block, passes
        self.out_features, self.in_features = block.weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.group, self.group_index = group if group is not None else (None, -1)
        self._product = None if group is not None else FixedRangeProduct(block, passes, packs)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, passes: int = 1) -> W8A8Linear:
        return cls(Int8Block.quantize(weight), bias, passes)

    def rows(self, index: torch.Tensor | slice) -> W8A8Linear:
        """A layer computing only the output rows `index`."""
        bias = None if self.bias is None else self.bias[index]
        return W8A8Linear(self.block.rows(index), bias, self.passes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.finish(self.group.product(x, self.group_index), x)
        return self.from_mapped(map_rows(x.reshape(-1, self.in_features).float(), self.passes), x)

    def from_mapped(self, mapped: MappedRows, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for input x, whose rows map_rows has already mapped."""
        return self.finish(self._product.apply(mapped), x)

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return layer_output(y, x, self.bias, self.out_features)

    def extra_repr(self) -> str:
        grouped = f", packed with the {len(self.group.widths)} layers reading its input" if self.group else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int8 weights × int8 activations, {self.passes} pass(es){grouped}"
        )


def same_input(layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of layers that all read x: a SharedInput group's in one kernel call; other
    W8A8Linear layers with the same number of passes share one mapping of x's rows; bitwise the
    same as calling each layer."""
    first = layers[0]
    group = getattr(first, "group", None)
    if (
        group is not None
        and len(layers) == len(group.widths)
        and all(getattr(layer, "group", None) is group for layer in layers)
    ):
        products = group.products(x)
        return [layer.finish(products[layer.group_index], x) for layer in layers]
    shared = all(
        isinstance(layer, W8A8Linear) and layer.group is None and layer.passes == first.passes for layer in layers
    )
    if not shared:
        return [layer(x) for layer in layers]
    mapped = map_rows(x.reshape(-1, first.in_features).float(), first.passes)
    return [layer.from_mapped(mapped, x) for layer in layers]


ONE_PASS_LAYERS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")  # attention projections (Phi-3: qkv_proj)


def activation_passes(name: str) -> int:
    """1 for the attention projections, 2 (about 16-bit activations) for the MLP and the head.

    Measured on the bundled 1.5B target, teacher-forced over 1,024 tokens against float32: two passes
    everywhere 98.5% top-1 / KL 0.0016; on the MLP only 97.9% / 0.0033; on down_proj only 96.7% / 0.014.
    """
    return 1 if name.rsplit(".", 1)[-1] in ONE_PASS_LAYERS else 2


def quantize_w8a8(
    model: nn.Module, blocks: dict[str, Int8Block] | None = None, passes: int | None = None
) -> dict[str, Int8Block]:
    """Replace every nn.Linear of `model` (the head too) by a W8A8Linear, from `blocks` (by module
    name) when given, else by quantizing its weights; returns the blocks used. Each layer takes
    `passes` activation passes, or as many as activation_passes gives for its name. Layers that read one
    input are packed as one matrix (SharedInput). Packing for the kernel is the slow part of a
    start, so it runs on two threads (torch releases the GIL)."""
    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    if blocks is None:
        blocks = {name: Int8Block.quantize(module.weight) for name, module in linears.items()}
    passes_of = (lambda name: passes) if passes else activation_passes
    groups = shared_input_groups(linears, passes_of)
    grouped = {member for members in groups for member in members}
    jobs = [blocks[name] for name in blocks if name not in grouped]
    jobs += [Int8Block.concat([blocks[member] for member in members]) for members in groups]
    with ThreadPoolExecutor(max_workers=2) as pool:
        packed = list(pool.map(pack_rows, jobs))
    packs = dict(zip([name for name in blocks if name not in grouped], packed))
    member_of = {}
    for members, block, group_packs in zip(groups, jobs[len(packs) :], packed[len(packs) :]):
        group = SharedInput(block, [blocks[m].weight.shape[0] for m in members], passes_of(members[0]), group_packs)
        member_of.update({member: (group, index) for index, member in enumerate(members)})
    replace_linears(
        model,
        lambda name, linear: W8A8Linear(
            blocks[name], linear.bias, passes_of(name), packs.get(name), member_of.get(name)
        ),
    )
    return blocks
