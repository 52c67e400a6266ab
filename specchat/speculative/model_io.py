"""The model interface the algorithm needs, and the only code that knows cache internals: make a cache,
measure it, roll it back, run a cached forward.

A model may carry its own fast forward under the attribute RUNNER (the runtime attaches one: runtime/lean.py);
it makes the caches, and each cache runs the forward over itself. Any other model gets transformers'
DynamicCache and runs through its own forward. The algorithm needs nothing else of a model.
"""

from __future__ import annotations

from typing import Any, Protocol, Union

import torch
from transformers import DynamicCache

RUNNER = "specchat_runner"  # attribute of a model that runs its own forward
PREFILL_CHUNK = 128  # prompt tokens a forward while a prompt is read: the longest a cancel waits (bench/prefill.py)


class Model(Protocol):
    """What the algorithm calls on a model: a transformers causal LM, or a view of one (self_layers.py). Its parts
    are torch modules whose attributes torch types loosely (nn.Module.__getattr__), hence Any."""

    config: Any

    def get_input_embeddings(self) -> Any: ...

    def get_output_embeddings(self) -> Any: ...

    def get_decoder(self) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class ModelCache(Protocol):
    """A cache that runs its model's forward over itself."""

    def get_seq_length(self) -> int: ...

    def crop_to(self, length: int) -> None: ...

    def run(self, input_ids: torch.Tensor, keep: int, head: bool = True) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...  # the bytes its keys and values hold (as allocated)


class Runner(Protocol):
    """A model's own forward: makes its caches; gives the runner of a view of the same layers."""

    def new_cache(self) -> ModelCache: ...

    def for_view(self, view: Any) -> Runner: ...


Cache = Union[DynamicCache, ModelCache]  # noqa: UP007 (evaluated at import)


def runner(model: object) -> Runner | None:
    own: Runner | None = getattr(model, RUNNER, None)
    return own


def new_cache(model: Model) -> Cache:
    own = runner(model)
    return own.new_cache() if own is not None else DynamicCache(config=model.config)


def cache_bytes(cache: Cache) -> int:
    """The bytes a cache's keys and values take."""
    if not isinstance(cache, DynamicCache):
        return cache.nbytes
    tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def cache_length(cache: Cache) -> int:
    return cache.get_seq_length()


def crop_to(cache: Cache, length: int) -> None:
    """Roll the cache back so it covers exactly the first `length` tokens."""
    if not isinstance(cache, DynamicCache):
        cache.crop_to(length)
        return
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
    elif extra < 0:
        raise ValueError(f"cannot crop a cache of {cache_length(cache)} tokens up to {length}")


def input_device(model: Model) -> torch.device:
    """Where a model's input ids go: its input embeddings' device (a table kept in blocks names its own)."""
    embed = model.get_input_embeddings()
    device: torch.device = embed.weight.device if hasattr(embed, "weight") else embed.device
    return device


@torch.inference_mode()
def forward(model: Model, cache: Cache, new_ids: list[int], keep: int) -> torch.Tensor:
    """Feed `new_ids` after what the cache holds; return logits of the last `keep` positions [keep, vocab]."""
    device = input_device(model)
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)  # [1, n]
    return forward_tensor(model, cache, input_ids, keep)


@torch.inference_mode()
def forward_tensor(model: Model, cache: Cache, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """Like forward, with ids already a [1, n] tensor on the model's device (no host round trip)."""
    if not isinstance(cache, DynamicCache):
        return cache.run(input_ids, keep)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    logits: torch.Tensor = out.logits[0, -keep:]
    return logits


@torch.inference_mode()
def hidden_tensor(model: Model, cache: Cache, input_ids: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """The decoder's final hidden states at the last `keep` positions [keep, hidden], skipping the head."""
    if not isinstance(cache, DynamicCache):
        return cache.run(input_ids, keep, head=False)
    out = model.get_decoder()(input_ids=input_ids, past_key_values=cache, use_cache=True)
    hidden: torch.Tensor = out.last_hidden_state[0, -keep:]
    return hidden
