"""The only code that knows cache internals: make, measure, roll back, run a cached forward.

A model with a lean forward attached (`attach_lean`) gets a LeanCache and runs through it; any other
model gets transformers' DynamicCache and runs through its own forward.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specchat.core.lean import LeanCache, LeanForward, supports

LEAN = "specchat_lean"  # attribute of a model that runs the lean forward


def attach_lean(model, native_layers=None) -> str:
    """Run `model` through the lean forward from now on; returns why not ('' when attached).
    native_layers: the compiled kernel module's LeanLayers, for w4a8 layers in one C++ call."""
    reason = supports(model)
    if not reason:
        setattr(model, LEAN, LeanForward(model, native_layers))
    return reason


def new_cache(model) -> DynamicCache | LeanCache:
    lean = getattr(model, LEAN, None)
    return LeanCache(lean) if lean is not None else DynamicCache(config=model.config)


def cache_length(cache) -> int:
    return cache.get_seq_length()


def crop_to(cache, length: int) -> None:
    """Roll the cache back so it covers exactly the first `length` tokens."""
    if isinstance(cache, LeanCache):
        return cache.crop_to(length)
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
    elif extra < 0:
        raise ValueError(f"cannot crop a cache of {cache_length(cache)} tokens up to {length}")


@torch.inference_mode()
def forward(model, cache, new_ids: list[int], keep: int) -> torch.Tensor:
    """Feed `new_ids` after what the cache holds; return logits of the last `keep` positions [keep, vocab]."""
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)  # [1, n]
    return forward_tensor(model, cache, input_ids, keep)


@torch.inference_mode()
def forward_tensor(model, cache, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """Like forward, with ids already a [1, n] tensor on the model's device (no host round trip)."""
    if isinstance(cache, LeanCache):
        return cache.forward(cache, input_ids, keep)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


@torch.inference_mode()
def hidden_tensor(model, cache, input_ids: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """The decoder's final hidden states at the last `keep` positions [keep, hidden], skipping the head."""
    if isinstance(cache, LeanCache):
        return cache.forward(cache, input_ids, keep, head=False)
    out = model.get_decoder()(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return out.last_hidden_state[0, -keep:]
