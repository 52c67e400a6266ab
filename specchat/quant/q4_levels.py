"""w4a8's levels packed into bytes: 4-bit levels two a byte, 6-bit ones as 4 low bits and 2 top bits, 8-bit ones a
byte each, and a GGUF's IQ4 table indices looked up (layout: kernels/q4/q4_tiles.h, q4_kernel.cpp).

Levels come and go as uint8 [out, in/32, 32]: a row's 32-groups, 32 levels each.
"""

from __future__ import annotations

import torch

GROUP = 32  # levels share a scale and an offset per 32-group; those share a float per block of inputs
HALF = GROUP // 2  # or, with `halves`, a scale and an offset per 16 inputs
PAIR = 2 * GROUP  # a stored row packs its groups two by two


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


def unpacked_levels(qs: torch.Tensor, bits: int) -> torch.Tensor:
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
