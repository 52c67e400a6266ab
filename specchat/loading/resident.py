"""Make a loaded model's weights resident in one go.

Weights loaded from safetensors are memory-mapped: each page is faulted in on its first read. On
this VM a fault costs about 10 µs, so reading the bundled pair's float32 embeddings page by page took
3.2 s, paid a token at a time (about 2 ms a forward while replies met new ids), and the first
forwards paid the same for the w4a8 blocks. `populate` asks Linux to map every page of the given
tensors at once (madvise MADV_POPULATE_READ, Linux 5.14 and later): 0.2 s for those embeddings.
Elsewhere, or on an older kernel, it does nothing and pages fault in as before.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterable

import torch
from torch import nn

from specchat.quant.block_embedding import BlockEmbedding
from specchat.quant.w4a8 import Q4Linear

MADV_POPULATE_READ = 22


def _madvise():
    """libc's madvise, or None where it cannot populate (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def model_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor a forward reads: parameters, buffers, and the w4a8 layers' blocks."""
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        if isinstance(module, Q4Linear):
            tensors.extend(module.tiles.tensors())
    return tensors


def read_whole(model: nn.Module, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Of a model's tensors, those a forward reads whole: not an embedding table in blocks, of which a chat
    reads a few hundred rows (it is mapped from the cache, and the rest of it stays on disk)."""
    tables = {id(module.blocks) for module in model.modules() if isinstance(module, BlockEmbedding)}
    return [tensor for tensor in tensors if id(tensor) not in tables]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes the tensors hold, each counted once (a tied weight, a layer's view of a fused group)."""
    return sum(nbytes for _, nbytes in {(t.data_ptr(), t.nbytes) for t in tensors})


def populate(tensors: Iterable[torch.Tensor]) -> int:
    """Map every page of the CPU tensors' storages now; returns how many storages were asked for
    (0 where the platform cannot). A kernel without MADV_POPULATE_READ refuses, harmlessly."""
    madvise = _madvise()
    if madvise is None:
        return 0
    asked: set[int] = set()
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if not size or address in asked:
            continue
        asked.add(address)
        start = address // mmap.PAGESIZE * mmap.PAGESIZE
        madvise(start, address + size - start, MADV_POPULATE_READ)
    return len(asked)
