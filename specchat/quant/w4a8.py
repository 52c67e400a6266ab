"""4-bit weights × 8-bit activations (`quantization = "w4a8"`): a quarter of bf16's bytes per step,
a kernel whose cost grows slowly from 1 to gamma+1 rows, and a result per row that never depends on
the other rows of its batch.

Why: decoding on a CPU reads every weight once per forward, so the bytes per step decide. 4-bit
weights in groups of 32 (a scale and an offset each, as llama.cpp's Q4_K) read about 0.6 of int8's.
The activations are mapped per row and per block of 256 (or 128, 64) inputs onto int8, so the dot
products are integer, exact, and the same whatever else the batch holds: greedy speculative output
equals greedy target-only output in the dtype the chat runs.

Q4Block is the weights' stored form (a row after a row); the kernel reads them as Q4Tiles, 16 output
rows interleaved so that each lane of a vector is one output row (layout: q4_tiles.h), repacked once
at load. The kernel (kernels/q4/: q4_kernel.cpp and its code paths, q4_path_*.cpp) is compiled once with the
machine's C++ compiler into specchat's cache, and picks its path at run time from what the CPU has.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specchat.memory import FreedPages
from specchat.quant.shared import layer_output, replace_linears, shared_input_groups

FINER_BITS = 6  # levels of the layers kept finer than 4 bits (a GGUF's Q6_K..., the head)
GROUP = 32  # levels share a scale and an offset per 32-group; those share a float per block of inputs
HALF = GROUP // 2  # or, with `halves`, a scale and an offset per 16 inputs
PAIR = 2 * GROUP  # a stored row packs its groups two by two
TILE_ROWS = 16  # output rows the kernel reads interleaved (one per 32-bit lane of a 512-bit vector)
QUANTIZE_ROWS = 8192  # rows quantized at a time
RETURN_EVERY = 64 << 20  # bytes of fused layers' own tiles let go between handing the heap's free pages back


def block_width(width: int) -> int:
    """Inputs per block: the widest of 256, 128, 64 that divides the width (a float per block)."""
    for block in (256, 128, PAIR):
        if width % block == 0:
            return block
    raise ValueError(f"w4a8 needs input widths divisible by {PAIR}, not {width}")


def fits(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape: its input width a multiple of 64 (levels are
    stored in pairs of 32-groups)."""
    return linear.in_features % PAIR == 0


def fitting_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's nn.Linear layers the kernel takes, by module name."""
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear) and fits(module)}


@dataclass
class Q4Block:
    """Weights [out, in] as 4-bit (or 6- or 8-bit) levels: w = d·sc·level − dmin·m (layout: q4_tiles.h), sc and m
    a 32-group's, or with `halves` a 16-input half's (int8, signed: a GGUF's Q6_K)."""

    qs: torch.Tensor  # uint8 [out, in/2] (4-bit levels, two a byte), [out, 3·in/4] (6-bit) or [out, in] (8-bit);
    #                   int8 [out, in/2]: 4-bit indices into IQ4_LEVELS (a GGUF's IQ4_NL, IQ4_XS)
    sc: torch.Tensor  # uint8 [out, in/32], or int8 [out, in/16] (halves)
    m: torch.Tensor  # as sc
    d: torch.Tensor  # float32 [out, blocks], each a float16's value: a block is 256 inputs where the width allows,
    #                  else 128 or 64; 32 (one group) for a GGUF's Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (the tiles store d
    #                  and dmin as float16, as llama.cpp does)
    dmin: torch.Tensor  # float32 [out, blocks], each a float16's value

    @classmethod
    def quantize(cls, weight: torch.Tensor, bits: int = 4) -> Q4Block:
        """Min/max levels per 32-group: 4 bits (two a byte), or 6 or 8 for layers kept finer. Each row is
        quantized on its own, QUANTIZE_ROWS at a time (a head of 151,936 rows needs no GBs of temporaries)."""
        if bits not in LEVEL_BITS:
            raise ValueError(f"w4a8 levels are 4, 6 or 8 bits, not {bits}")
        return cls.concat(
            [
                cls._quantize_rows(weight[start : start + QUANTIZE_ROWS], bits)
                for start in range(0, weight.shape[0], QUANTIZE_ROWS)
            ]
        )

    @classmethod
    def concat(cls, parts: list[Q4Block]) -> Q4Block:
        """The blocks of consecutive row ranges as one."""
        if len(parts) == 1:
            return parts[0]
        return cls(*(torch.cat(fields).contiguous() for fields in zip(*(part.tensors() for part in parts))))

    @classmethod
    def _quantize_rows(cls, weight: torch.Tensor, bits: int) -> Q4Block:
        top = float(2**bits - 1)
        w = weight.detach().float()
        rows, width = w.shape
        per_block = block_width(width) // GROUP
        groups = w.reshape(rows, width // GROUP, GROUP)
        low = groups.amin(dim=2).clamp(max=0.0)  # [out, in/32], ≤ 0
        step = (groups.amax(dim=2) - low) / top  # [out, in/32]
        d, sc = _in_units(step, per_block)
        dmin, m = _in_units(-low, per_block)
        step_q = d.repeat_interleave(per_block, 1) * sc.float()
        offset_q = dmin.repeat_interleave(per_block, 1) * m.float()
        levels = ((groups + offset_q[..., None]) / step_q.clamp(min=1e-30)[..., None]).round_().clamp_(0, top)
        levels = levels.to(torch.uint8)
        return cls(LEVEL_BITS[bits][0](levels), sc, m, d, dmin)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """(qs, sc, m, d, dmin), the kernel's arguments after x."""
        return self.qs, self.sc, self.m, self.d, self.dmin

    @property
    def halves(self) -> bool:
        """Whether sc and m are per 16 inputs (int8), not per 32-group (uint8)."""
        return self.sc.dtype == torch.int8

    @property
    def inputs(self) -> int:
        return self.sc.shape[1] * (HALF if self.halves else GROUP)

    @property
    def table(self) -> bool:
        """Whether the 4-bit levels are indices into IQ4_LEVELS (qs int8)."""
        return self.qs.dtype == torch.int8

    @property
    def bits(self) -> int:
        """Bits a level: 4, 6 or 8, from how many bytes a row of levels takes."""
        width = self.inputs
        return {width // 2: 4, width * 3 // 4: 6, width: 8}[self.qs.shape[1]]

    def dequantize(self) -> torch.Tensor:
        """The float32 weights [out, in] these levels stand for."""
        per = self.sc.shape[1] // self.d.shape[1]  # scales a block
        levels = _levels(self.qs, self.bits).float().reshape(self.sc.shape[0], self.sc.shape[1], -1)
        step = self.d.repeat_interleave(per, 1) * self.sc.float()
        offset = self.dmin.repeat_interleave(per, 1) * self.m.float()
        return (levels * step[..., None] - offset[..., None]).flatten(1)


def _in_units(values: torch.Tensor, per_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """values [out, in/32] ≥ 0 as unit [out, blocks] float32 × count [out, in/32] uint8 (0..255); each unit a
    float16's value (the next one up where rounding went down, so the largest count stays within 255)."""
    rows = values.shape[0]
    blocks = values.view(rows, -1, per_block)
    unit = _half_at_least(blocks.amax(dim=2) / 255.0)
    counts = (blocks / unit.clamp(min=1e-30)[..., None]).round_().clamp_(0, 255)
    return unit.contiguous(), counts.to(torch.uint8).view(rows, -1).contiguous()


HALF_MAX = float(torch.finfo(torch.float16).max)


def _half_at_least(unit: torch.Tensor) -> torch.Tensor:
    """The least float16 value ≥ each float32 of `unit` (≥ 0), as float32; float16's largest past it."""
    half = unit.clamp(max=HALF_MAX).half()
    low = half.float() < unit
    half[low] = torch.nextafter(half[low], torch.tensor(float("inf"), dtype=torch.float16))
    return half.clamp(max=HALF_MAX).float()


def _pack_levels(levels: torch.Tensor) -> torch.Tensor:
    """uint8 levels [out, in/32, 32] → [out, in/2]: byte i of a 64-chunk holds level i of its first
    32-group (low nibble) and level i of the second (high nibble)."""
    pairs = levels.view(levels.shape[0], -1, 2, GROUP)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).flatten(1).contiguous()


def _unpack_levels(packed: torch.Tensor) -> torch.Tensor:
    """[out, in/2] → uint8 levels [out, in/32, 32]."""
    chunks = packed.view(packed.shape[0], -1, 1, GROUP)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).flatten(1, 2)


def _pack_levels_6(levels: torch.Tensor) -> torch.Tensor:
    """uint8 levels 0..63 [out, in/32, 32] → [out, 3·in/4]: per 64-chunk, the low 4 bits as
    _pack_levels packs them, then 16 bytes of top 2 bits (layout: q4_kernel.cpp)."""
    rows = levels.shape[0]
    pairs = levels.view(rows, -1, 2, GROUP)  # [out, in/64, 2, 32]
    nibbles = _pack_levels((levels & 0x0F).contiguous()).view(rows, -1, GROUP)
    top = pairs >> 4  # 0..3
    first, second = top[:, :, 0], top[:, :, 1]
    tops = (first[..., :HALF] << 4) | (first[..., HALF:] << 6) | second[..., :HALF] | (second[..., HALF:] << 2)
    return torch.cat([nibbles, tops], dim=2).flatten(1).contiguous()


def _unpack_levels_6(packed: torch.Tensor) -> torch.Tensor:
    """[out, 3·in/4] → uint8 levels [out, in/32, 32]."""
    rows = packed.shape[0]
    chunks = packed.view(rows, -1, GROUP + HALF)  # [out, in/64, 48]
    low = _unpack_levels(chunks[..., :GROUP].contiguous().view(rows, -1)).view(rows, -1, 2, GROUP)
    tops = chunks[..., GROUP:]  # [out, in/64, 16]
    first = torch.cat([(tops >> 4) & 3, tops >> 6], dim=2)
    second = torch.cat([tops & 3, (tops >> 2) & 3], dim=2)
    return (low | (torch.stack([first, second], dim=2) << 4)).flatten(1, 2)


def _bytes_per_level(levels: torch.Tensor) -> torch.Tensor:
    """uint8 levels [out, in/32, 32] → [out, in], a byte each (8-bit levels)."""
    return levels.flatten(1).contiguous()


def _level_per_byte(qs: torch.Tensor) -> torch.Tensor:
    return qs.view(qs.shape[0], -1, GROUP)


IQ4_LEVELS = torch.tensor([1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241], dtype=torch.uint8)
# llama.cpp's kvalues_iq4nl (−127 … 113) + 128: the level a table index stands for (kernels/q4/q4_tiles.h's too)


def _levels(qs: torch.Tensor, bits: int) -> torch.Tensor:
    """A Q4Block's qs → uint8 levels [out, in/32, 32], table indices looked up."""
    if qs.dtype == torch.int8:
        return IQ4_LEVELS[_unpack_levels(qs.view(torch.uint8)).long()]
    return LEVEL_BITS[bits][1](qs)


# bits → (pack, unpack) between uint8 levels [out, in/32, 32] and the kernel's qs
LEVEL_BITS = {
    4: (_pack_levels, _unpack_levels),
    6: (_pack_levels_6, _unpack_levels_6),
    8: (_bytes_per_level, _level_per_byte),
}


@dataclass
class Q4Tiles:
    """A Q4Block as the kernel reads it: tiles of 16 output rows, interleaved (layout: q4_tiles.h).
    The last tile is padded with zero rows; `outs` is the true number of output rows."""

    qs: torch.Tensor  # uint8 [tiles, in/32, 16 · bytes a row's 32-group takes (16, 24 or 32)]; int8: table indices
    # sc: uint8 [tiles, in/32, 16]; halves: int8 [tiles, in/32, 2·16], a group's first 16 inputs' then its last's
    sc: torch.Tensor
    # m: uint8 [tiles, in/64, 32], groups 2p and 2p+1 side by side per row; halves: int8 [tiles, in/32, 32], a
    # group's two halves side by side per row
    m: torch.Tensor
    d: torch.Tensor  # float16 [tiles, blocks, 16] (blocks: in/32 where a block is one group)
    dmin: torch.Tensor  # float16 [tiles, blocks, 16]
    outs: int

    @classmethod
    def from_block(cls, block: Q4Block) -> Q4Tiles:
        """The block's tiles, QUANTIZE_ROWS rows (a multiple of 16) at a time: a head's temporaries stay small."""
        rows = block.sc.shape[0]
        if rows <= QUANTIZE_ROWS:
            return cls._from_rows(block)
        parts = [
            cls._from_rows(Q4Block(*(t[start : start + QUANTIZE_ROWS] for t in block.tensors())))
            for start in range(0, rows, QUANTIZE_ROWS)
        ]
        return cls(*(torch.cat(fields) for fields in zip(*(part.tensors() for part in parts))), outs=rows)

    @classmethod
    def _from_rows(cls, block: Q4Block) -> Q4Tiles:
        rows = block.sc.shape[0]
        tiles = -(-rows // TILE_ROWS)
        levels = LEVEL_BITS[block.bits][1](block.qs.view(torch.uint8))  # [out, in/32, 32] (or table indices)
        d, dmin = (_as_half(_tile(t, tiles).transpose(1, 2).contiguous()) for t in (block.d, block.dmin))
        sc = _tile(block.sc, tiles)  # [tiles, 16, scales a row]
        if block.halves:
            sc = sc.view(tiles, TILE_ROWS, -1, 2).permute(0, 2, 3, 1).reshape(tiles, -1, 2 * TILE_ROWS).contiguous()
        else:
            sc = sc.transpose(1, 2).contiguous()
        m = _tile(block.m, tiles).view(tiles, TILE_ROWS, -1, 2).permute(0, 2, 1, 3).reshape(tiles, -1, 2 * TILE_ROWS)
        qs = _tile_levels(_tile(levels, tiles), block.bits).view(block.qs.dtype)
        return cls(qs, sc, m.contiguous(), d, dmin, outs=rows)

    def to_block(self) -> Q4Block:
        """The weights a row after a row (the padding rows dropped)."""
        levels = _untile_levels(self.qs.view(torch.uint8), self.bits)[: self.outs]
        d, dmin = (t.transpose(1, 2).flatten(0, 1)[: self.outs].float().contiguous() for t in (self.d, self.dmin))
        tiles = self.m.shape[0]
        if self.sc.dtype == torch.int8:  # halves
            sc = self.sc.view(tiles, -1, 2, TILE_ROWS).permute(0, 3, 1, 2).reshape(tiles * TILE_ROWS, -1)
        else:
            sc = self.sc.transpose(1, 2).flatten(0, 1)
        sc = sc[: self.outs].contiguous()
        m = self.m.view(tiles, -1, TILE_ROWS, 2).permute(0, 2, 1, 3).reshape(tiles * TILE_ROWS, -1)[: self.outs]
        qs = LEVEL_BITS[self.bits][0](levels.contiguous()).view(self.qs.dtype)
        return Q4Block(qs, sc, m.contiguous(), d, dmin)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """(qs, sc, m, d, dmin), the kernel's arguments after x."""
        return self.qs, self.sc, self.m, self.d, self.dmin

    @property
    def bits(self) -> int:
        return {16: 4, 24: 6, 32: 8}[self.qs.shape[2] // TILE_ROWS]

    def rows(self, index: torch.Tensor | slice) -> Q4Tiles:
        """The tiles of only the output rows `index`: views of whole tiles when `index` is a run of them (a
        drafter's head for the ids below its limit), else only the tiles the rows lie in, unpacked."""
        whole = self._whole_tiles(index)
        if whole is not None:
            return whole
        wanted = torch.arange(self.outs)[index]
        tiles = torch.unique(wanted // TILE_ROWS)
        local = torch.searchsorted(tiles, wanted // TILE_ROWS) * TILE_ROWS + wanted % TILE_ROWS
        part = Q4Tiles(*(t[tiles] for t in self.tensors()), outs=len(tiles) * TILE_ROWS).to_block()
        return Q4Tiles.from_block(Q4Block(*(t[local].contiguous() for t in part.tensors())))

    def _whole_tiles(self, index: torch.Tensor | slice) -> Q4Tiles | None:
        """Views of tiles first..last when `index` is the slice of their rows (the last tile's padding
        included), else None."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            return None
        start, stop, _ = index.indices(self.outs)
        if start % TILE_ROWS or stop <= start or (stop % TILE_ROWS and stop != self.outs):
            return None
        tiles = slice(start // TILE_ROWS, -(-stop // TILE_ROWS))
        return Q4Tiles(*(t[tiles] for t in self.tensors()), outs=stop - start)

    def dequantize(self) -> torch.Tensor:
        return self.to_block().dequantize()


def _as_half(scales: torch.Tensor) -> torch.Tensor:
    """A block's d or dmin as the tiles store it, float16; each must be a float16's value already (Q4Block.quantize
    and Q4_K's blocks make them so), as the kernel must compute what Q4Block.dequantize says."""
    half = scales.half()
    if not torch.equal(half.float(), scales.float()):
        raise ValueError("a w4a8 block's d and dmin must be float16 values (Q4Block.quantize makes them so)")
    return half


def _tile(rows: torch.Tensor, tiles: int) -> torch.Tensor:
    """[out, ...] → [tiles, 16, ...], padded with zero rows."""
    missing = tiles * TILE_ROWS - rows.shape[0]
    if missing:
        rows = torch.cat([rows, rows.new_zeros(missing, *rows.shape[1:])])
    return rows.view(tiles, TILE_ROWS, *rows.shape[1:])


def _tile_levels(levels: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 levels [tiles, 16, in/32, 32] → the kernel's qs [tiles, in/32, 16 · group bytes]."""
    tiles, _, groups, _ = levels.shape
    vectors = levels.view(tiles, TILE_ROWS, groups, 8, 4).permute(0, 2, 3, 1, 4)  # [tiles, groups, 8, 16, 4]
    if bits == 8:
        return vectors.reshape(tiles, groups, -1).contiguous()
    low = vectors & 0x0F
    parts = [(low[:, :, :4] | (low[:, :, 4:] << 4)).reshape(tiles, groups, -1)]
    if bits == 6:
        top = (vectors >> 4).view(tiles, groups, 2, 4, TILE_ROWS, 4)
        parts.append(
            (top[:, :, :, 0] | (top[:, :, :, 1] << 2) | (top[:, :, :, 2] << 4) | (top[:, :, :, 3] << 6)).reshape(
                tiles, groups, -1
            )
        )
    return torch.cat(parts, dim=2).contiguous()


def _untile_levels(qs: torch.Tensor, bits: int) -> torch.Tensor:
    """The kernel's qs [tiles, in/32, bytes] → uint8 levels [tiles·16, in/32, 32]."""
    tiles, groups = qs.shape[:2]
    if bits == 8:
        vectors = qs.view(tiles, groups, 8, TILE_ROWS, 4)
    else:
        nibbles = qs[:, :, :256].reshape(tiles, groups, 4, TILE_ROWS, 4)
        vectors = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)
        if bits == 6:
            top = qs[:, :, 256:].reshape(tiles, groups, 2, 1, TILE_ROWS, 4)
            shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 1, 4, 1, 1)
            vectors = vectors | (((top >> shifts) & 3).reshape(tiles, groups, 8, TILE_ROWS, 4) << 4)
    return vectors.permute(0, 3, 1, 2, 4).reshape(tiles * TILE_ROWS, groups, GROUP)


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
    Q4Linear; returns the tiles used (what the quantized cache stores). The others stay as they are.

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
        parts = zip(*(layer.tiles.tensors() for layer in layers))
        self.widths = [layer.out_features for layer in layers]
        self.fused = Q4Tiles(*(torch.cat(tensors).contiguous() for tensors in parts), outs=sum(self.widths))
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
    layers' own tiles it let go (0: not fused)."""
    layers = [model.get_submodule(name) for name in names]
    if not all(isinstance(layer, Q4Linear) for layer in layers):
        return 0
    tiles = [layer.tiles for layer in layers]
    alike = len({(t.qs.shape[2], t.qs.dtype, t.sc.dtype, t.d.shape[1]) for t in tiles}) == 1  # one layout
    if not alike or any(layer.out_features % TILE_ROWS for layer in layers):
        return 0
    Q4Group(layers)
    return sum(t.nbytes for part in tiles for t in part.tensors())


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
