"""Q4Block, w4a8's weights as stored: a row after a row, levels per 32-group with a scale and an offset each, those
in units of a float per block of inputs (w = d·sc·level − dmin·m, as llama.cpp's Q4_K); made from float weights
here, or from a GGUF's own blocks (loading/gguf/blocks.py). The kernel reads them repacked as Q4Tiles (q4_tiles.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from specchat.quant.q4_levels import GROUP, HALF, LEVEL_BITS, PAIR, unpacked_levels

QUANTIZE_ROWS = 8192  # rows quantized at a time
HALF_MAX = float(torch.finfo(torch.float16).max)


def rows_in_place(rows: int, chunks: Iterable[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """Tensors of `rows` rows (the first dimension) filled from the tensors of consecutive chunks of rows, each
    copied into place as it comes; a lone chunk of all the rows is used as it is."""
    whole: list[torch.Tensor] = []
    start = 0
    for chunk in chunks:
        count = chunk[0].shape[0]
        if start == 0 and count == rows:
            return list(chunk)
        if not whole:
            whole = [t.new_empty(rows, *t.shape[1:]) for t in chunk]
        for into, part in zip(whole, chunk, strict=True):
            into[start : start + count] = part
        start += count
    if start != rows:
        raise ValueError(f"the chunks hold {start} rows, not {rows}")
    return whole


def block_width(width: int) -> int:
    """Inputs per block: the widest of 256, 128, 64 that divides the width (a float per block)."""
    for block in (256, 128, PAIR):
        if width % block == 0:
            return block
    raise ValueError(f"w4a8 needs input widths divisible by {PAIR}, not {width}")


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
        return cls.from_chunks(
            weight.shape[0],
            (
                cls._quantize_rows(weight[start : start + QUANTIZE_ROWS], bits)
                for start in range(0, weight.shape[0], QUANTIZE_ROWS)
            ),
        )

    @classmethod
    def from_chunks(cls, rows: int, chunks: Iterable[Q4Block]) -> Q4Block:
        """The block of `rows` rows from the blocks of consecutive runs of them, each copied into place as it comes:
        no list of them held beside the whole (a 151,936-row head in Q6_K: 0.5 GB less at its peak)."""
        return cls(*rows_in_place(rows, (chunk.tensors() for chunk in chunks)))

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
        levels = unpacked_levels(self.qs, self.bits).float().reshape(self.sc.shape[0], self.sc.shape[1], -1)
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


def _half_at_least(unit: torch.Tensor) -> torch.Tensor:
    """The least float16 value ≥ each float32 of `unit` (≥ 0), as float32; float16's largest past it."""
    half = unit.clamp(max=HALF_MAX).half()
    low = half.float() < unit
    half[low] = torch.nextafter(half[low], torch.tensor(float("inf"), dtype=torch.float16))
    return half.clamp(max=HALF_MAX).float()
