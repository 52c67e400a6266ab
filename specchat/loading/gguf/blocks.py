"""A GGUF file's Q4_K tensors as w4a8 blocks, bit for bit.

llama.cpp's Q4_K stores w = d·sc·q − dmin·m in 256-blocks of eight 32-groups (6-bit sc and m, fp16 d
and dmin) with the very nibble layout of kernels/q4/q4_kernel.cpp, so a Q4_K layer runs on the w4a8 kernel
with exactly the file's weights. Each imported layer is checked against the weights the model loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from specchat.quant.w4a8 import Q4Block

Q4_K_BYTES = 144  # per 256 weights: d, dmin (fp16), 12 bytes of packed 6-bit sc/m, 128 bytes of nibbles
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
    if raw.dim() != 2 or raw.dtype != torch.uint8 or raw.shape[1] % Q4_K_BYTES:
        raise ValueError(f"Q4_K blocks are uint8 [rows, blocks·{Q4_K_BYTES}], got {raw.dtype} {list(raw.shape)}")
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, Q4_K_BYTES)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float().reshape(rows, -1)
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float().reshape(rows, -1)
    s = blocks[..., 4:16].int()
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    m = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    qs = blocks[..., 16:].reshape(rows, -1)
    as_bytes = lambda t: t.to(torch.uint8).reshape(rows, -1).contiguous()
    return Q4Block(qs.contiguous(), as_bytes(sc), as_bytes(m), d.contiguous(), dmin.contiguous())


def q4_k_blocks(path: str | Path) -> dict[str, Q4Block]:
    """Every Q4_K weight of a GGUF file whose layer transformers names, decoded, by module name."""
    from gguf import GGMLQuantizationType

    from specchat.loading.gguf.header import read_tensors

    found = {}
    for tensor in read_tensors(Path(path))[1]:
        name = module_name(tensor.name)
        if name and tensor.tensor_type == GGMLQuantizationType.Q4_K:
            found[name] = decode_q4_k(torch.from_numpy(tensor.data.copy()))
    return found


def matching_blocks(path: str | Path, model: nn.Module) -> dict[str, Q4Block]:
    """The GGUF's Q4_K blocks for the model's linear layers, each kept only where it decodes to the
    weights the model holds (to within their dtype's rounding): a layer the loader reordered or changed
    is left to be quantized from its weights."""
    modules = dict(model.named_modules())
    kept = {}
    for name, block in q4_k_blocks(path).items():
        layer = modules.get(name)
        if isinstance(layer, nn.Linear) and _decodes_to(block, layer.weight):
            kept[name] = block
    return kept


def _decodes_to(block: Q4Block, weight: torch.Tensor) -> bool:
    if tuple(weight.shape) != (block.sc.shape[0], block.sc.shape[1] * 32):
        return False
    w = weight.detach().float()
    tolerance = w.abs().amax(dim=1, keepdim=True) * torch.finfo(weight.dtype).eps * 2 + 1e-12
    return bool(((block.dequantize() - w).abs() <= tolerance).all())


def streamed_blocks(path: str | Path, model: nn.Module, finer_bits: int) -> Iterator[tuple[str, Q4Block]]:
    """(name, w4a8 block) of every linear layer of `model` the kernel takes, read from the GGUF a tensor at a
    time (the model's own weights may be on the meta device): a Q4_K tensor the loader takes as stored is
    used bit for bit (decode_q4_k equals gguf-py's dequantize, tests/loading/test_gguf_blocks.py), any
    other is dequantized as transformers would and quantized to `finer_bits` levels: the rule
    quantize_w4a8 applies with a GGUF's blocks at hand."""
    from gguf import GGMLQuantizationType

    from specchat.loading.gguf.tensors import GGUFTensors
    from specchat.quant.w4a8 import fitting_linears

    tensors = GGUFTensors(Path(path), model)
    for name, layer in fitting_linears(model).items():
        weight = f"{name}.weight"
        info = tensors.info(weight)
        if (
            info.tensor_type == GGMLQuantizationType.Q4_K
            and tensors.unchanged(weight)
            and tuple(layer.weight.shape) == (tensors.rows(weight), int(info.shape[0]))
        ):
            yield name, decode_q4_k(tensors.raw(weight))
        elif tensors.unchanged(weight):  # row chunks: no float copy of a 151,936-row head
            yield name, Q4Block.concat([Q4Block.quantize(rows, finer_bits) for rows in tensors.float_chunks(weight)])
        else:
            yield name, Q4Block.quantize(tensors.float(weight).reshape(layer.weight.shape), finer_bits)
