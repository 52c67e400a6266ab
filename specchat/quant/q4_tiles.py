"""Q4Tiles, w4a8's weights as the kernel reads them: 16 output rows interleaved so that each lane of a vector is one
output row (layout: kernels/q4/q4_tiles.h), repacked once at load from a Q4Block and back; a layer's rows taken out
as views of whole tiles where they can be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.quant.q4_block import QUANTIZE_ROWS, Q4Block, rows_in_place
from specchat.quant.q4_levels import GROUP, LEVEL_BITS

TILE_ROWS = 16  # output rows the kernel reads interleaved (one per 32-bit lane of a 512-bit vector)


@dataclass
class Q4Tiles:
    """A Q4Block as the kernel reads it: tiles of 16 output rows, interleaved (layout: q4_tiles.h).
    The last tile is padded with zero rows; `outs` is the true number of output rows."""

    qs: torch.Tensor  # uint8 [tiles, in/32, 16 · bytes a row's 32-group takes (16, 24 or 32)]; int8: table indices
    # sc: uint8 [tiles, in/32, 16]; halves: int8 [tiles, in/32, 2·16], a group's first 16 inputs' then its last's;
    # [tiles, in/32, 0] in blocks of one group whose every scale is 1
    sc: torch.Tensor
    # m: uint8 [tiles, in/64, 32], groups 2p and 2p+1 side by side per row; halves: int8 [tiles, in/32, 32], a
    # group's two halves side by side per row
    m: torch.Tensor
    d: torch.Tensor  # float16 [tiles, blocks, 16] (blocks: in/32 where a block is one group)
    dmin: torch.Tensor  # float16 [tiles, blocks, 16]; [tiles, blocks, 0] where it is d
    outs: int

    @classmethod
    def from_block(cls, block: Q4Block) -> Q4Tiles:
        """The block's tiles, QUANTIZE_ROWS rows (a multiple of 16) at a time: a head's temporaries stay small.
        What the layout lets go unstored is left out: the scales of blocks of one group when every one is 1 (sc
        [tiles, in/32, 0]), and dmin where it equals d (dmin [tiles, blocks, 0]): a GGUF's Q4_0 and Q8_0."""
        rows = block.sc.shape[0]
        parts = (
            cls._from_rows(Q4Block(*(t[start : start + QUANTIZE_ROWS] for t in block.tensors()))).tensors()
            for start in range(0, rows, QUANTIZE_ROWS)
        )
        return cls(*rows_in_place(-(-rows // TILE_ROWS), parts), outs=rows).compact()  # chunks: whole tiles

    @classmethod
    def concat(cls, parts: list[Q4Tiles], outs: int) -> Q4Tiles:
        """The tiles of consecutive runs of rows as one (each part but the last whole tiles), compact: a view
        where the parts already lie side by side in memory (loading/tile_arena.py), else a copy."""
        alike = len({(part.sc.shape[2], part.dmin.shape[2]) for part in parts}) == 1
        fields = zip(*((part.tensors() if alike else part.full_tensors()) for part in parts))
        return cls(*(_joined(tensors) for tensors in fields), outs=outs).compact()

    def compact(self) -> Q4Tiles:
        """These tiles with sc and dmin left out where the layout lets them be (q4_tiles.h)."""
        sc, dmin = self.sc, self.dmin
        one_group = self.d.shape[1] == sc.shape[1] and sc.dtype == torch.uint8
        if one_group and sc.shape[2] and bool((sc.transpose(1, 2).flatten(0, 1)[: self.outs] == 1).all()):  # padding: 0
            sc = sc.new_empty(*sc.shape[:2], 0)  # new storage: a view would keep the scales' bytes held
        if dmin.shape[2] and torch.equal(dmin, self.d):
            dmin = dmin.new_empty(*dmin.shape[:2], 0)
        return Q4Tiles(self.qs, sc, self.m, self.d, dmin, outs=self.outs)

    def full_tensors(self) -> tuple[torch.Tensor, ...]:
        """(qs, sc, m, d, dmin) with nothing left out."""
        return self.qs, self.full_sc, self.m, self.d, self.full_dmin

    @property
    def full_sc(self) -> torch.Tensor:
        """sc as stored where left out: every scale 1."""
        return self.sc if self.sc.shape[2] else torch.ones(*self.sc.shape[:2], TILE_ROWS, dtype=self.sc.dtype)

    @property
    def full_dmin(self) -> torch.Tensor:
        """dmin, d where left out."""
        return self.dmin if self.dmin.shape[2] else self.d

    @classmethod
    def _from_rows(cls, block: Q4Block) -> Q4Tiles:
        rows = block.sc.shape[0]
        tiles = -(-rows // TILE_ROWS)
        d, dmin = (_as_half(_tile(t, tiles).transpose(1, 2).contiguous()) for t in (block.d, block.dmin))
        sc = _tile(block.sc, tiles)  # [tiles, 16, scales a row]
        if block.halves:
            sc = sc.view(tiles, TILE_ROWS, -1, 2).permute(0, 2, 3, 1).reshape(tiles, -1, 2 * TILE_ROWS).contiguous()
        else:
            sc = sc.transpose(1, 2).contiguous()
        m = _tile(block.m, tiles).view(tiles, TILE_ROWS, -1, 2).permute(0, 2, 1, 3).reshape(tiles, -1, 2 * TILE_ROWS)
        if block.bits == 4:  # 4-bit levels (or table indices): straight from their bytes
            qs = _tile_packed_4bit(block.qs.view(torch.uint8), tiles).view(block.qs.dtype)
        elif block.bits == 6:
            qs = _tile_packed_6bit(block.qs, tiles)
        else:
            levels = LEVEL_BITS[block.bits][1](block.qs.view(torch.uint8))  # [out, in/32, 32]
            qs = _tile_levels(_tile(levels, tiles), block.bits)
        return cls(qs, sc, m.contiguous(), d, dmin, outs=rows)

    def to_block(self) -> Q4Block:
        """The weights a row after a row (the padding rows dropped)."""
        levels = _untile_levels(self.qs.view(torch.uint8), self.bits)[: self.outs]
        d, dmin = (t.transpose(1, 2).flatten(0, 1)[: self.outs].float().contiguous() for t in (self.d, self.full_dmin))
        tiles = self.m.shape[0]
        if self.sc.dtype == torch.int8:  # halves
            sc = self.sc.view(tiles, -1, 2, TILE_ROWS).permute(0, 3, 1, 2).reshape(tiles * TILE_ROWS, -1)
        else:
            sc = self.full_sc.transpose(1, 2).flatten(0, 1)
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


def _joined(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """torch.cat of the tensors (along the first dimension), as a view of their memory where they lie side by side
    in one storage, each contiguous, of one dtype and shape but the first dimension."""
    first = tensors[0]
    storage, at = first.untyped_storage(), first.data_ptr()
    for tensor in tensors:
        same = tensor.dtype == first.dtype and tensor.shape[1:] == first.shape[1:] and tensor.is_contiguous()
        if not same or tensor.untyped_storage().data_ptr() != storage.data_ptr() or tensor.data_ptr() != at:
            return torch.cat(tensors).contiguous()
        at += tensor.nbytes
    shape = (sum(tensor.shape[0] for tensor in tensors), *first.shape[1:])
    return first.new_empty(0).set_(storage, first.storage_offset(), shape)


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


def _tile_packed_4bit(packed: torch.Tensor, tiles: int) -> torch.Tensor:
    """A Q4Block's 4-bit qs [out, in/2] (q4_levels._pack_levels: byte p·32 + i holds level i of group 2p and of
    group 2p+1) → the kernel's qs [tiles, in/32, 256], as _tile_levels makes it but with no level unpacked: byte
    c·64 + 4j + t of group g holds row j's level 4c + t (low nibble) and 16 + 4c + t (high). A 7B-shape layer's tiles
    (Zen 5): Q4_0 0.22 → 0.15 s, Q4_K 0.24 → 0.17 s."""
    rows = packed.shape[0]
    x = packed.view(rows, -1, 2, 4, 4)  # [out, in/64, h, c, t]: byte p·32 + 16h + 4c + t, levels 16h + 4c + t
    first = (x[:, :, 0] & 0x0F) | ((x[:, :, 1] & 0x0F) << 4)  # group 2p's
    second = (x[:, :, 0] >> 4) | (x[:, :, 1] & 0xF0)  # group 2p + 1's
    groups = torch.stack([first, second], dim=2).view(rows, -1, 4, 4)  # [out, in/32, c, t]
    return _tile(groups, tiles).permute(0, 2, 3, 1, 4).reshape(tiles, -1, 16 * TILE_ROWS).contiguous()


def _tile_packed_6bit(packed: torch.Tensor, tiles: int) -> torch.Tensor:
    """A Q4Block's 6-bit qs [out, 3·in/4] (q4_levels._pack_levels_6: per 64 inputs 32 bytes of low nibbles as the
    4-bit levels', then 16 bytes of top 2 bits: byte i holds those of level i of group 2p at bits 4-5, of level 16 + i
    at 6-7, of group 2p + 1's level i at 0-1 and 16 + i at 2-3) → the kernel's qs [tiles, in/32, 384] (q4_tiles.h: the
    4-bit part, then top chunk e's byte 4j + t: row j's levels 16e + 4s + t, s = 0..3, at bits 2s), with no level
    unpacked. A 7B-shape ffn_down in Q6_K (Zen 5): its tiles 0.31 → 0.22 s."""
    rows = packed.shape[0]
    chunks = packed.view(rows, -1, 48)  # [out, in/64, 32 + 16]
    nibbles = _tile_packed_4bit(chunks[..., :32].reshape(rows, -1), tiles)  # [tiles, in/32, 256]
    tops = chunks[..., 32:].reshape(rows, -1, 4, 4)  # [out, in/64, s, t]: byte 4s + t
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)  # where level 4s + t's top goes in a tile byte
    fields = [((tops >> at) & 3) << shifts for at in (4, 6, 0, 2)]  # group 2p: levels i, 16 + i; group 2p + 1: same
    merged = [field[:, :, 0] | field[:, :, 1] | field[:, :, 2] | field[:, :, 3] for field in fields]  # [out, in/64, t]
    groups = torch.stack(merged, dim=2).view(rows, -1, 2, 4)  # [out, in/32, e, t]
    top = _tile(groups, tiles).permute(0, 2, 3, 1, 4).reshape(tiles, -1, 8 * TILE_ROWS)
    return torch.cat([nibbles, top], dim=2).contiguous()


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
