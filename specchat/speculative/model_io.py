"""The model interface the algorithm needs, and the only code that knows cache internals: make a cache,
measure it, roll it back, run a cached forward.

A model may carry its own fast forward under the attribute RUNNER (the runtime attaches one: runtime/lean.py);
it makes the caches, and each cache runs the forward over itself. Any other model gets transformers'
DynamicCache in a TransformersKVCache, which runs the model's own forward. Every cache is a KVCache: the algorithm
asks it, never its type. The algorithm needs nothing else of a model.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from transformers import DynamicCache

RUNNER = "specchat_runner"  # attribute of a model that runs its own forward
DRAFT_HEAD = "specchat_draft_head"  # attribute of a target with a draft head trained for it (drafters/head.py)
FEATURES = "specchat_features"  # attribute of a transformers model whose caches keep their last forward's features
PREFILL_CHUNK = 128  # prompt tokens a forward while a prompt is read: the longest a cancel waits (bench/prefill.py)


class Model(Protocol):
    """What the algorithm calls on a model: a transformers causal LM, or a view of one (self_layers.py). Its parts
    are torch modules whose attributes torch types loosely (nn.Module.__getattr__), hence Any."""

    config: Any

    def get_input_embeddings(self) -> Any: ...

    def get_output_embeddings(self) -> Any: ...

    def get_decoder(self) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class KVCache(Protocol):
    """What the algorithm needs of a cache: how many tokens it holds, a cut back to its first `length`, a forward of
    its model over itself, and its bytes. The lean runtime's cache meets it (runtime/lean.py); transformers' caches
    meet it through TransformersKVCache."""

    def get_seq_length(self) -> int: ...

    def crop_to(self, length: int) -> None: ...  # keep the first `length` tokens (never more than it holds)

    def run(self, input_ids: torch.Tensor, keep: int, head: bool = True) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...  # the bytes its keys and values hold (as allocated)


class Runner(Protocol):
    """A model's own forward: makes its caches; gives the runner of a view of the same layers."""

    def new_kv_cache(self) -> KVCache: ...

    def for_view(self, view: Any) -> Runner: ...


class TransformersKVCache:
    """transformers' DynamicCache and the model it belongs to, as a KVCache: the model's own forward runs over it."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.inner = DynamicCache(config=model.config)

    def get_seq_length(self) -> int:
        return self.inner.get_seq_length()

    def crop_to(self, length: int) -> None:
        extra = self.get_seq_length() - length
        if extra < 0:
            raise ValueError(f"cannot crop a cache of {self.get_seq_length()} tokens up to {length}")
        if extra:
            self.inner.crop(-extra)

    def run(self, input_ids: torch.Tensor, keep: int, head: bool = True) -> torch.Tensor:
        if head and getattr(self.model, FEATURES, False):
            return self._logits_and_features(input_ids, keep)
        if head:
            out = self.model(input_ids=input_ids, past_key_values=self.inner, use_cache=True, logits_to_keep=keep)
            logits: torch.Tensor = out.logits[0, -keep:]
            return logits
        hidden: torch.Tensor = self.model.get_decoder()(
            input_ids=input_ids, past_key_values=self.inner, use_cache=True
        ).last_hidden_state[0, -keep:]
        return hidden

    def _logits_and_features(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """The model's logits as its own forward computes them (decoder, head, a final soft-cap), its last hidden
        states kept as `features` (what the lean forward keeps at no cost)."""
        hidden = self.model.get_decoder()(input_ids=input_ids, past_key_values=self.inner, use_cache=True)
        self.features = hidden.last_hidden_state[0, -keep:]
        logits: torch.Tensor = self.model.get_output_embeddings()(self.features)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    @property
    def nbytes(self) -> int:
        layers = self.inner.layers
        tensors = [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
        return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def features(cache: KVCache) -> torch.Tensor | None:
    """The last hidden states (after the final norm) of the rows the cache's last forward kept [keep, hidden]: the lean
    forward's always, transformers' where the model asks for them (FEATURES); else None."""
    kept: torch.Tensor | None = getattr(cache, "features", None)
    return kept


def runner(model: object) -> Runner | None:
    own: Runner | None = getattr(model, RUNNER, None)
    return own


def new_kv_cache(model: Model) -> KVCache:
    own = runner(model)
    return own.new_kv_cache() if own is not None else TransformersKVCache(model)


def kv_bytes(cache: KVCache) -> int:
    """The bytes a cache's keys and values take."""
    return cache.nbytes


def kv_length(cache: KVCache) -> int:
    return cache.get_seq_length()


def crop_to(cache: KVCache, length: int) -> None:
    """Roll the cache back so it covers exactly the first `length` tokens."""
    cache.crop_to(length)


def input_device(model: Model) -> torch.device:
    """Where a model's input ids go: its input embeddings' device (a table kept in blocks names its own)."""
    embed = model.get_input_embeddings()
    device: torch.device = embed.weight.device if hasattr(embed, "weight") else embed.device
    return device


@torch.inference_mode()
def forward(model: Model, cache: KVCache, new_ids: list[int], keep: int) -> torch.Tensor:
    """Feed `new_ids` after what the cache holds; return logits of the last `keep` positions [keep, vocab]."""
    device = input_device(model)
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)  # [1, n]
    return forward_tensor(model, cache, input_ids, keep)


@torch.inference_mode()
def forward_tensor(model: Model, cache: KVCache, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """Like forward, with ids already a [1, n] tensor on the model's device (no host round trip)."""
    return cache.run(input_ids, keep)


@torch.inference_mode()
def hidden_tensor(model: Model, cache: KVCache, input_ids: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """The decoder's final hidden states at the last `keep` positions [keep, hidden], skipping the head."""
    return cache.run(input_ids, keep, head=False)
