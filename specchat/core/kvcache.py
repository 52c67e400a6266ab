"""The only code that knows cache internals: make, measure, roll back, run a cached forward."""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop_to(cache: DynamicCache, length: int) -> None:
    """Roll the cache back so it covers exactly the first `length` tokens."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
    elif extra < 0:
        raise ValueError(f"cannot crop a cache of {cache_length(cache)} tokens up to {length}")


@torch.inference_mode()
def forward(model, cache: DynamicCache, new_ids: list[int], keep: int) -> torch.Tensor:
    """Feed `new_ids` after what the cache holds; return logits of the last `keep` positions [keep, vocab]."""
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)  # [1, n]
    return forward_tensor(model, cache, input_ids, keep)


@torch.inference_mode()
def forward_tensor(model, cache: DynamicCache, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """Like forward, with ids already a [1, n] tensor on the model's device (no host round trip)."""
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


@torch.inference_mode()
def hidden_tensor(model, cache: DynamicCache, input_ids: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """The decoder's final hidden states at the last `keep` positions [keep, hidden], skipping the head."""
    out = model.get_decoder()(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return out.last_hidden_state[0, -keep:]
