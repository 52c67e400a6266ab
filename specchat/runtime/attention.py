"""Attention whose result for a query row does not depend on how many rows are computed together.

With batch-invariant linears (w8a8.py), attention is the last place where verifying gamma+1 rows
at once could differ from decoding them one by one: torch's SDPA kernels on the CPU take other
paths for one query row than for several, and the CPU's matmul takes another path below 4 rows
in float32. This is transformers' eager attention with two changes:
- grouped-query heads are folded into the rows of one matmul per key/value head, instead of
  copying the keys and values for every query head (`repeat_kv`);
- the rows of each matmul are padded with zeros up to MIN_ROWS, so every call takes the path that
  computes each row the same way however many rows there are.
Softmax is per row, so the whole layer is batch-invariant; tests/quant/test_w8a8.py checks a whole layer bitwise.
"""

from __future__ import annotations

import torch
from torch import nn

NAME = "specchat_batch_invariant"
MIN_ROWS = 4


def batch_invariant_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    **_kwargs,
):
    """query [B, H, rows, D], key/value [B, KV, L, D] → ([B, rows, H, D], None). softcap: Gemma-2's soft-capping
    of the scores, tanh(s / softcap) · softcap, before the mask (as transformers' eager attention)."""
    batch, heads, rows, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    folded = query.reshape(batch, kv_heads, groups * rows, dim)
    scores = _padded_matmul(folded, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.reshape(batch, kv_heads, groups, rows, length)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, None, :, :length]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = _padded_matmul(weights.view(batch, kv_heads, groups * rows, length), value)
    return out.reshape(batch, heads, rows, dim).transpose(1, 2).contiguous(), None


def _padded_matmul(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    rows = left.shape[-2]
    if rows >= MIN_ROWS:
        return torch.matmul(left, right)
    padding = left.new_zeros(*left.shape[:-2], MIN_ROWS - rows, left.shape[-1])
    return torch.matmul(torch.cat([left, padding], dim=-2), right)[..., :rows, :]


def use_batch_invariant_attention(model: nn.Module) -> None:
    """Switch a transformers model to batch_invariant_attention (eager masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(NAME, batch_invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)
    model.set_attn_implementation(NAME)
