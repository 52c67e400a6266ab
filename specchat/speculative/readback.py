"""One device-to-host read for what a step needs to know, instead of one per token.

On a GPU every read (`.item()`, `.tolist()`, `int(t)`, `float(t)`) waits for all the work queued before it.
A speculative step reads its verdict, its drafts, each token's p and q, all together, once (step.py); the
drafter keeps its tokens on the device while it drafts (drafters.py).
"""

from __future__ import annotations

import torch

Readable = torch.Tensor | int | float  # a tensor to read, or a number passed through


def read_back(*parts: Readable) -> list[list[float]]:
    """Each part's values as a list, read in one transfer. Tensors (any shape, any device: moved to the first
    tensor's) are flattened and read as float32, which holds token ids (below 2**24) and float32, bfloat16 and
    float16 values exactly and which every backend has (MPS has no float64); a part that is a plain number is
    passed through as [number]."""
    tensors = [part for part in parts if isinstance(part, torch.Tensor)]
    flat: list[float] = []
    if tensors:
        device = tensors[0].device
        flat = torch.cat([t.detach().reshape(-1).to(device=device, dtype=torch.float32) for t in tensors]).tolist()
    values: list[list[float]] = []
    at = 0
    for part in parts:
        if isinstance(part, torch.Tensor):
            values.append(flat[at : at + part.numel()])
            at += part.numel()
        else:
            values.append([part])
    return values


def ints(values: list[float]) -> list[int]:
    return [int(v) for v in values]
