"""A GGUF file's blocks as w4a8 blocks: the types the kernel holds as they are, bit for bit; the others
requantized, said in one notice line a model.

llama.cpp's Q4_K stores w = d·sc·q − dmin·m in 256-blocks of eight 32-groups (6-bit sc and m, fp16 d
and dmin) with the very nibble layout of kernels/q4/q4_kernel.cpp, so a Q4_K layer runs on the w4a8 kernel
with exactly the file's weights. Q5_K is the same with 5-bit q: the kernel's 6-bit levels hold it exactly.
Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 give each 32-group a float16 scale (and Q4_1/Q5_1 a float16 min) of its own: the
kernel's blocks of one 32-group hold them (sc 1; the offset as dmin·m: Q4_0 d·8, Q5_0 d·16, Q8_0 d·128 with
levels q + 128, Q4_1/Q5_1 −min·1), and their activations are quantized per 32 inputs, as llama.cpp's are.
Q6_K scales 16-input halves (a signed int8 each): the kernel's `halves` blocks hold it (6-bit levels q, sc and m
the file's scale, dmin 32·d). IQ4_NL and IQ4_XS place their 16 levels non-linearly (−127 … 113): the kernel holds
their 4-bit indices and looks each level up (t + 128; IQ4_NL in blocks of one group, offset d·128 as Q8_0's;
IQ4_XS in halves, its signed 32-group scale on both, dmin 128·d). Q2_K and Q3_K are dequantized as transformers
dequantizes them and quantized to the finer levels (6 bits; 4 in w4a8-fast): their weights change, by less than
the file's own quantization step (python -m specchat.bench.targets --gguf FILE measures what that does to the
next-token distribution). Each imported layer is checked against the weights the model loaded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator
from functools import partial
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from torch import nn

from specchat.loading.finite import check_weights
from specchat.loading.gguf.header import read_tensors
from specchat.loading.gguf.tensors import GGUFTensors
from specchat.quant.q4_block import HALF_MAX, QUANTIZE_ROWS, Q4Block
from specchat.quant.q4_levels import GROUP, LEVEL_BITS
from specchat.quant.w4a8 import FINER_BITS, fitting_linears

Q4_K_BYTES = 144  # per 256 weights: d, dmin (fp16), 12 bytes of packed 6-bit sc/m, 128 bytes of nibbles
Q5_K_BYTES = 176  # per 256 weights: d, dmin, 12 bytes of sc/m, 32 bytes of fifth bits, 128 bytes of nibbles
FLOAT_KINDS = ("F32", "F16", "BF16")  # float tensors: quantized as any float model's, not requantized
LAYERS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}  # llama.cpp's names in Llama/Qwen2 files → transformers' modules


def module_name(tensor_name: str) -> str | None:
    """transformers' module for a GGUF weight name (blk.3.attn_q.weight → model.layers.3.self_attn.q_proj)."""
    if tensor_name == "output.weight":
        return "lm_head"
    parts = tensor_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in LAYERS:
        return f"model.layers.{parts[1]}.{LAYERS[parts[2]]}"
    return None


def decode_q4_k(raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, blocks·144] of Q4_K blocks → the Q4Block of the same weights."""
    rows, blocks = _blocks(raw, "Q4_K", Q4_K_BYTES)
    d, dmin, sc, m = _k_scales(blocks)
    return Q4Block(blocks[..., 16:].reshape(rows, -1).contiguous(), sc, m, d, dmin)


def decode_q5_k(raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, blocks·176] of Q5_K blocks → the Q4Block of the same weights, in 6-bit levels: a level is
    the nibble (laid out as Q4_K's) with bit 4 from the block's qh (byte i, bit g: element i of 32-group g)."""
    rows, blocks = _blocks(raw, "Q5_K", Q5_K_BYTES)
    d, dmin, sc, m = _k_scales(blocks)
    low = LEVEL_BITS[4][1](blocks[..., 48:].reshape(rows, -1).contiguous())  # [rows, in/32, 32]
    qh = blocks[..., 16:48]  # [rows, blocks, 32]
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)
    high = ((qh.unsqueeze(2) >> shifts) & 1).reshape(rows, -1, 32)
    return Q4Block(LEVEL_BITS[6][0]((low | (high << 4)).contiguous()), sc, m, d, dmin)


# Bytes of a 32-block of the one-scale-a-group types: d (fp16), [min (fp16)], [qh (4 bytes)], then the levels.
GROUP_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


def decode_group_type(kind: str, raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, groups·bytes] of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 blocks → the Q4Block of the same weights in
    blocks of one 32-group: sc 1, w = d·level − dmin·m (Q4_0: dmin d, m 8; Q5_0: d, 16; Q8_0: d, 128 with levels
    q + 128; Q4_1 and Q5_1: dmin −min, m 1). Level j of a group: nibble j of qs (j < 16: the low, else the high of
    byte j − 16), bit 4 from qh's bit j (Q5_*); Q8_0's are its int8 values."""
    rows, blocks = _blocks(raw, kind, GROUP_BLOCK_BYTES[kind])
    d = _float16_at(blocks, 0, rows)
    with_min = kind in ("Q4_1", "Q5_1")
    start = 4 if with_min else 2
    ones = torch.ones(rows, blocks.shape[1], dtype=torch.uint8)
    if kind == "Q8_0":
        levels = (blocks[..., 2:].view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return Q4Block(LEVEL_BITS[8][0](levels.contiguous()), ones, ones * 128, d, d.clone())
    qs = blocks[..., start + (4 if kind.startswith("Q5") else 0) :]  # [rows, groups, 16]
    levels = _group_nibbles(qs)
    bits = 4
    if kind.startswith("Q5"):
        qh = blocks[..., start : start + 4].to(torch.int64)
        word = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        fifth = (word.unsqueeze(-1) >> torch.arange(32)) & 1
        levels, bits = levels | (fifth.to(torch.uint8) << 4), 6
    if with_min:
        dmin, m = -_float16_at(blocks, 2, rows), ones
    else:
        dmin, m = d.clone(), ones * (8 if kind == "Q4_0" else 16)
    return Q4Block(LEVEL_BITS[bits][0](levels.contiguous()), ones, m, d, dmin)


Q6_K_BYTES = 210  # per 256 weights: 128 bytes of low nibbles, 64 of top 2 bits, 16 int8 scales, fp16 d
IQ4_XS_BYTES = 136  # per 256 weights: fp16 d, 2 bytes of the scales' top bits, 4 of their low nibbles, 128 of indices


def decode_q6_k(raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, blocks·210] of Q6_K blocks → the Q4Block of the same weights in halves: 6-bit levels q (element
    e of a 128-half i: low nibble of ql byte e % 64, the high one past 64; top 2 bits of qh byte e % 32 at 2·(e // 32)),
    sc and m the int8 scale of each 16, d the block's and dmin 32·d: w = d·sc·(q − 32)."""
    rows, blocks = _blocks(raw, "Q6_K", Q6_K_BYTES)
    low = (blocks[..., :128].reshape(rows, -1, 2, 1, 64) >> _shifts(0, 4)) & 0x0F
    high = (blocks[..., 128:192].reshape(rows, -1, 2, 1, 32) >> _shifts(0, 2, 4, 6)) & 3
    levels = (low.reshape(rows, -1) | (high.reshape(rows, -1) << 4)).view(rows, -1, GROUP)
    scales = blocks[..., 192:208].contiguous().view(torch.int8).reshape(rows, -1).contiguous()
    d = _float16_at(blocks, 208, rows)
    _fits_half(d * 32, "Q6_K")
    return Q4Block(LEVEL_BITS[6][0](levels.contiguous()), scales, scales.clone(), d, d * 32)


def decode_iq4_nl(raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, groups·18] of IQ4_NL blocks (fp16 d, 16 bytes of indices: element j the low nibble of byte j,
    j ≥ 16 the high one of byte j − 16) → blocks of one 32-group of table indices (levels t + 128), as Q8_0's."""
    rows, blocks = _blocks(raw, "IQ4_NL", 18)
    ones = torch.ones(rows, blocks.shape[1], dtype=torch.uint8)
    d = _float16_at(blocks, 0, rows)
    return Q4Block(_table_indices(blocks[..., 2:]), ones, ones * 128, d, d.clone())


def decode_iq4_xs(raw: torch.Tensor) -> Q4Block:
    """uint8 [rows, blocks·136] of IQ4_XS blocks → the Q4Block of the same weights in halves: table indices (t + 128),
    each 32-group's signed scale (6 bits less 32: low nibble g of the 4 scale bytes, top 2 bits at 2g of the uint16)
    as both its halves' sc and m, dmin 128·d: w = d·s·t."""
    rows, blocks = _blocks(raw, "IQ4_XS", IQ4_XS_BYTES)
    d = _float16_at(blocks, 0, rows)
    _fits_half(d * 128, "IQ4_XS")
    top = blocks[..., 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [rows, blocks, 1]
    low = (blocks[..., 4:8].reshape(rows, -1, 4, 1) >> _shifts(0, 4).view(-1)).reshape(rows, -1, 8) & 0x0F
    high = (top >> (2 * torch.arange(8))) & 3
    scales = (low.to(torch.int32) | (high << 4)) - 32  # [rows, blocks, 8]
    halves = scales.repeat_interleave(2, dim=2).reshape(rows, -1).to(torch.int8).contiguous()
    return Q4Block(_table_indices(blocks[..., 8:].reshape(rows, -1, 16)), halves, halves.clone(), d, d * 128)


def _table_indices(indices: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, groups, 16] of a file's nibble pairs → a Q4Block's int8 qs of table indices (q4_levels.IQ4_LEVELS)."""
    return LEVEL_BITS[4][0](_group_nibbles(indices)).view(torch.int8)


def _group_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, groups, 16] of a 32-block's packed nibbles → [rows, groups, 32]: element j the low nibble of
    byte j, j ≥ 16 the high one of byte j − 16 (Q4_0, Q4_1, Q5_*'s low bits, IQ4_NL, IQ4_XS)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).contiguous()


def _shifts(*bits: int) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.uint8).view(-1, 1)


def _float16_at(blocks: torch.Tensor, at: int, rows: int) -> torch.Tensor:
    """The float16 at byte `at` of each block, as float32 [rows, blocks]."""
    return blocks[..., at : at + 2].contiguous().view(torch.float16).float().reshape(rows, -1).contiguous()


class ScaleOverflow(ValueError):
    """A block's offset scale (32·d, 128·d) past float16's range: the tensor is requantized instead."""


def _fits_half(dmin: torch.Tensor, kind: str) -> None:
    if not bool((dmin.abs() <= HALF_MAX).all()):
        raise ScaleOverflow(f"a {kind} block's scale is too large to hold as stored")


def _blocks(raw: torch.Tensor, kind: str, size: int) -> tuple[int, torch.Tensor]:
    if raw.dim() != 2 or raw.dtype != torch.uint8 or raw.shape[1] % size:
        raise ValueError(f"{kind} blocks are uint8 [rows, blocks·{size}], got {raw.dtype} {list(raw.shape)}")
    return raw.shape[0], raw.reshape(raw.shape[0], -1, size)


def _k_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(d, dmin) float32 [rows, blocks] and (sc, m) uint8 [rows, in/32] of Q4_K or Q5_K blocks [rows, blocks, bytes]."""
    rows = blocks.shape[0]
    d, dmin = _float16_at(blocks, 0, rows), _float16_at(blocks, 2, rows)
    s = blocks[..., 4:16].int()
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    m = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    as_bytes = lambda t: t.to(torch.uint8).reshape(rows, -1).contiguous()
    return d, dmin, as_bytes(sc), as_bytes(m)


# GGML types the kernel holds as stored: (bits a level, decoder)
AS_STORED = {
    "Q4_K": (4, decode_q4_k),
    "Q5_K": (6, decode_q5_k),
    **{
        kind: (4 if kind.startswith("Q4") else 8 if kind == "Q8_0" else 6, partial(decode_group_type, kind))
        for kind in GROUP_BLOCK_BYTES
    },
    "Q6_K": (6, decode_q6_k),
    "IQ4_NL": (4, decode_iq4_nl),
    "IQ4_XS": (4, decode_iq4_xs),
}


def as_stored(kind: str, finer_bits: int) -> bool:
    """Whether a tensor of GGML type `kind` runs on the kernel as stored: a 4-bit type always, a finer one (Q5_K,
    Q5_0, Q5_1, Q8_0) unless every layer is made 4-bit (w4a8-fast: finer_bits 4)."""
    return kind in AS_STORED and (AS_STORED[kind][0] == 4 or finer_bits > 4)


def requantized_notice(requantized: Counter, finer_bits: int) -> str | None:
    """The notice line for {GGML type: tensors requantized}, or None when there are none."""
    if not requantized:
        return None
    listed = _listed([f"{count} {kind}" for kind, count in sorted(requantized.items())])
    noun = "tensor" if sum(requantized.values()) == 1 else "tensors"
    held = _listed([kind for kind in AS_STORED if as_stored(kind, finer_bits)])
    return (
        f"{listed} {noun} requantized to {finer_bits}-bit w4a8 levels (the kernel holds {held} as is); "
        f"fidelity: python -m specchat.bench.targets --gguf FILE"
    )


def _listed(parts: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def q4_k_blocks(path: str | Path) -> dict[str, Q4Block]:
    """Every Q4_K weight of a GGUF file whose layer transformers names, decoded, by module name."""
    found = {}
    for tensor in read_tensors(Path(path))[1]:
        name = module_name(tensor.name)
        if name and tensor.tensor_type == GGMLQuantizationType.Q4_K:
            found[name] = decode_q4_k(torch.from_numpy(tensor.data.copy()))
    return found


def layer_kinds(path: str | Path) -> Counter:
    """{GGML type name: tensors} of the file's linear-layer weights (those module_name names; a tied head, none)."""
    return Counter(tensor.tensor_type.name for tensor in read_tensors(Path(path))[1] if module_name(tensor.name))


def matching_blocks(
    path: str | Path, model: nn.Module, finer_bits: int = FINER_BITS, say: Callable[[str], None] | None = None
) -> dict[str, Q4Block]:
    """The GGUF's blocks of the types the kernel holds as stored (AS_STORED) for the model's linear layers, each
    kept only where it decodes to the weights the model holds (to within their dtype's rounding): a layer the
    loader reordered or changed is left to be quantized from its weights. say(the notice line) when the file's
    blocks of other types (or any not kept) are requantized."""
    layers = fitting_linears(model)
    stored = {tensor.name: tensor for tensor in read_tensors(Path(path))[1]}
    if "output.weight" not in stored and "token_embd.weight" in stored:  # a tied head: read from the embeddings
        stored["output.weight"] = stored.pop("token_embd.weight")
    kept, requantized = {}, Counter()
    for stored_name, tensor in stored.items():
        name = module_name(stored_name)  # a tied head's tensor keeps its own name, token_embd.weight
        if name not in layers:
            continue
        kind = tensor.tensor_type.name
        if as_stored(kind, finer_bits):
            block = _decoded(kind, torch.from_numpy(tensor.data.copy()))
            if block is not None and _decodes_to(block, layers[name].weight):
                kept[name] = block
                continue
        if kind not in FLOAT_KINDS:
            requantized[kind] += 1
    _say(say, requantized_notice(requantized, finer_bits))
    return kept


def _decoded(kind: str, raw: torch.Tensor) -> Q4Block | None:
    """The kernel's block of a tensor of a type it holds as stored, decoded QUANTIZE_ROWS rows at a time (a head of
    151,936 rows needs no GB of temporaries); None where a scale is past what it holds."""
    decode = AS_STORED[kind][1]
    try:
        return Q4Block.from_chunks(
            len(raw), (decode(raw[start : start + QUANTIZE_ROWS]) for start in range(0, len(raw), QUANTIZE_ROWS))
        )
    except ScaleOverflow:
        return None


def _say(say: Callable[[str], None] | None, line: str | None) -> None:
    if say is not None and line:
        say(line)


def _decodes_to(block: Q4Block, weight: torch.Tensor) -> bool:
    if tuple(weight.shape) != (block.sc.shape[0], block.inputs):
        return False
    w = weight.detach().float()
    tolerance = w.abs().amax(dim=1, keepdim=True) * torch.finfo(weight.dtype).eps * 2 + 1e-12
    return bool(((block.dequantize() - w).abs() <= tolerance).all())


def streamed_blocks(
    path: str | Path,
    model: nn.Module,
    finer_bits: int,
    say: Callable[[str], None] | None = None,
    leave_out: Collection[str] = (),
) -> Iterator[tuple[str, Q4Block]]:
    """(name, w4a8 block) of every linear layer of `model` the kernel takes, read from the GGUF a tensor at a
    time (the model's own weights may be on the meta device): a tensor of a type the kernel holds as stored
    (AS_STORED) is used bit for bit (decode_q4_k and decode_q5_k equal gguf-py's dequantize,
    tests/loading/test_gguf_blocks.py), its rows in the order transformers puts them (Llama's q and k); any
    other is dequantized as transformers would and quantized to `finer_bits` levels: the rule quantize_w4a8
    applies with a GGUF's blocks at hand. Once every layer is read, say(the notice line) where blocks of a
    quantized type were requantized. The layers named in `leave_out` are not read."""
    tensors = GGUFTensors(Path(path), model)
    requantized: Counter = Counter()
    for name, layer in fitting_linears(model).items():
        if name in leave_out:
            continue
        weight = f"{name}.weight"
        block = _stored_block(tensors, weight, layer, finer_bits)
        if block is not None:
            check_weights(Path(path).name, [(f"{weight}'s block scales", torch.cat([block.d, block.dmin], 1))])
            yield name, block
            continue
        kind = tensors.kind(weight)
        if kind not in FLOAT_KINDS:
            requantized[kind] += 1
        if tensors.unchanged(weight):  # row chunks: no float copy of a 151,936-row head
            rows_of = tensors.float_chunks(weight)
            blocks = (Q4Block.quantize(_checked(path, weight, rows), finer_bits) for rows in rows_of)
            yield name, Q4Block.from_chunks(tensors.rows(weight), blocks)
        else:
            values = _checked(path, weight, tensors.float(weight))
            yield name, Q4Block.quantize(values.reshape(layer.weight.shape), finer_bits)
    _say(say, requantized_notice(requantized, finer_bits))


def _checked(path: str | Path, weight: str, values: torch.Tensor) -> torch.Tensor:
    check_weights(Path(path).name, [(weight, values)])
    return values


def _stored_block(tensors, weight: str, layer: nn.Linear, finer_bits: int) -> Q4Block | None:
    """The layer's block decoded from the file's own, in the model's row order; None where its type is not held
    as stored, its shape is not the layer's, or transformers changes it beyond reordering rows."""
    info = tensors.info(weight)
    kind = info.tensor_type.name
    if not as_stored(kind, finer_bits) or tuple(layer.weight.shape) != (tensors.rows(weight), int(info.shape[0])):
        return None
    try:
        order = tensors.row_order(weight)
    except ScaleOverflow:
        return None
    block = _decoded(kind, tensors.raw(weight))
    return block if block is None or order is None else Q4Block(*(part[order].contiguous() for part in block.tensors()))
