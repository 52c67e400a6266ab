"""A lean decoder forward for Llama-style models (Llama, Mistral, Qwen2, Qwen3, Gemma-2, Gemma-3, Phi-3), on the
transformers model's own modules.

transformers' forward builds, for every call, a cache update by concatenation, position ids, rotary
tables and a mask, and dispatches through several Python layers per decoder layer. This forward
uses the same weights and the same linear layers (bf16, int8, w8a8: whatever the loader put there),
and instead:
- a static KV cache per model: one key and one value tensor per layer with room for `capacity`
  tokens, written in place; rolling back moves a length. It grows by doubling when full; the compiled
  layer loop stores it in 16 bits (KV_CACHE_TYPES);
- rotary cos/sin for every position computed once by the model's own rotary module, and looked up
  (LongRoPE's short or long factors per position: rope.py; over part of a head where the model rotates only that);
- a causal mask of only the rows fed (a one-token step needs none), and long prompts fed in pieces; a
  sliding-window layer (Mistral, Gemma's local layers) reads only its window's keys;
- Gemma's extras from the model's own modules and config: its norms (1 + w, the norms after attention and
  MLP), its scaled embeddings, its attention scale, Gemma-2's soft-capped attention and final logits, and
  Gemma-3's own rotary tables for its local layers;
- Phi-3's fused qkv_proj and gate_up_proj as one product each, split by views (fused.py);
- the attention of runtime/attention.py, so the forward stays batch-invariant where its linears are;
- w8a8 layers that read the same input (q/k/v, gate/up) map its rows onto the kernel's grid once,
  and, packed as one matrix, take one kernel call;
- w4a8 float32 decoders run all their layers in one compiled call (lean_native.py): plain C++ loops
  between the kernel's products, as batch-invariant as the Python loop, and within float rounding of it.
Which architectures it runs is runtime/architectures.py's table (LEAN_RUNS); others, and models spread over several
devices, keep the transformers path.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant import w4a8, w8a8
from specchat.runtime import architectures, fused, lean_native, rope
from specchat.runtime.attention import batch_invariant_attention
from specchat.speculative import model_io
from specchat.speculative.model_io import RUNNER, input_device

# How the compiled layer loop stores keys and values: float16 and bfloat16 take half the bytes of float32
# (their rounding is measured by python -m specchat.bench.targets --kv-cache); the Python loop keeps its
# activations' dtype.
KV_CACHE_TYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
FIRST_CAPACITY = 1024


def attach_lean(model: nn.Module, native_layers=None, kv_cache: str = "float16") -> str:
    """Run `model` through the lean forward from now on; returns why not ('' when attached).
    native_layers: the compiled kernel module's LeanLayers, for w4a8 layers in one C++ call;
    kv_cache: how those layers store keys and values (KV_CACHE_TYPES)."""
    reason = supports(model)
    if not reason:
        setattr(model, RUNNER, LeanForward(model, native_layers, kv_cache))
    return reason


def supports(model: nn.Module) -> str:
    """'' when the lean forward can run `model` (its architecture's needs, architectures.py), else why not."""
    reason = architectures.unsupported(model.config, architectures.LEAN_RUNS, "the lean forward", type(model).__name__)
    if reason:
        return reason
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return "it is spread over several devices"
    if model.config.get_text_config() is not model.config:
        return f"{type(model).__name__} is more than a text decoder"
    if getattr(model.config, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    return ""


class LeanKVCache:
    """Keys and values of every layer for the first `length` tokens, in tensors of fixed capacity."""

    def __init__(self, forward: LeanForward):
        self.forward = forward
        self.length = 0
        self.keys: list[torch.Tensor] = []  # per layer [kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.features: torch.Tensor | None = None  # the last forward's kept rows' final hidden states

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    @property
    def nbytes(self) -> int:
        """The bytes its keys and values take, at their capacity."""
        return sum(t.nbytes for t in (*self.keys, *self.values))

    def get_seq_length(self) -> int:
        return self.length

    def crop_to(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens up to {length}")
        self.length = length

    def run(self, input_ids: torch.Tensor, keep: int, head: bool = True) -> torch.Tensor:
        return self.forward(self, input_ids, keep, head)

    def make_room(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(FIRST_CAPACITY, self.capacity)
        while capacity < needed:
            capacity *= 2
        self.keys = [self.forward.grow(k, capacity) for k in self.keys] or self.forward.empty_kv(capacity)
        self.values = [self.forward.grow(v, capacity) for v in self.values] or self.forward.empty_kv(capacity)


class LeanForward:
    """forward(cache, ids [1, n], keep) → logits [keep, vocab] for the last `keep` of the n positions.

    native_layers: the compiled kernel module's LeanLayers class, or None. Given it, w4a8 float32
    decoders run their layers in one C++ call (lean_native.py); `native_reason` says why not ('' when
    they do). kv_cache: how those store keys and values (KV_CACHE_TYPES); `kv_dtype` is what the
    cache holds."""

    def __init__(self, model: nn.Module, native_layers=None, kv_cache: str = "float16"):
        if kv_cache not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_TYPES)}, not {kv_cache!r}")
        self.model = model
        self.native_layers = native_layers
        self.kv_cache = kv_cache
        self._native = None
        decoder = model.get_decoder()
        self.layers = list(decoder.layers)
        self.embed, self.norm, self.head = decoder.embed_tokens, decoder.norm, model.get_output_embeddings()
        self.rotary = decoder.rotary_emb
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = getattr(self.layers[0].self_attn, "scaling", None) or self.head_dim**-0.5
        self.windows = [_window(layer.self_attn, config) for layer in self.layers]  # keys a layer reads; None: all
        self.rope_types = _rope_types(self.rotary, config, len(self.layers))  # per layer: its rotary table's key
        needs = architectures.model_needs(config) or frozenset()
        self.attention_cap = getattr(config, "attn_logit_softcapping", None) if "soft_capping" in needs else None
        self.logit_cap = getattr(config, "final_logit_softcapping", None)
        self.embed_scale = None  # Gemma's √hidden where the embedding module does not scale by itself
        if "embedding_scale" in needs and not hasattr(self.embed, "embed_scale"):
            self.embed_scale = torch.tensor(config.hidden_size**0.5).to(self._activation_dtype)
        self.device = input_device(model)
        self._cos: dict[str | None, torch.Tensor] = {}
        self._sin: dict[str | None, torch.Tensor] = {}
        self.native_reason = (
            "no compiled kernel module was given"
            if native_layers is None
            else lean_native.unsupported(self.layers, self.norm, config, self._activation_dtype, self.head_dim)
        )
        self.kv_dtype = KV_CACHE_TYPES[kv_cache] if not self.native_reason else self._activation_dtype

    def new_kv_cache(self) -> LeanKVCache:
        return LeanKVCache(self)

    def for_view(self, view: nn.Module) -> LeanForward:
        """The lean forward of a view of this model's layers (the self drafter's first layers)."""
        return LeanForward(view, self.native_layers, self.kv_cache)

    def __getstate__(self) -> dict:
        """A copy (copy.deepcopy of the model) builds its own compiled layers over its own weights."""
        return self.__dict__ | {"_native": None}

    def native_loop(self):
        """The compiled layer loop, built on first use; None where the Python loop runs."""
        if self._native is None and not self.native_reason:
            tables = list(dict.fromkeys(self.rope_types))  # _tables' order: the forward stacks them so
            parts = lean_native.Attention(
                tuple(self.windows), tuple(tables.index(rope) for rope in self.rope_types), self.attention_cap
            )
            self._native = lean_native.build(
                self.native_layers,
                self.layers,
                self.norm,
                self.heads,
                self.kv_heads,
                self.head_dim,
                self.scaling,
                self.model.config,
                parts,
            )
        return self._native

    # ----- tables computed once (regrown with the cache) ------------------------------------------
    def empty_kv(self, capacity: int) -> list[torch.Tensor]:
        return [
            torch.zeros(self.kv_heads, capacity, self.head_dim, dtype=self.kv_dtype, device=self.device)
            for _ in self.layers
        ]

    def grow(self, tensor: torch.Tensor, capacity: int) -> torch.Tensor:
        bigger = tensor.new_zeros(tensor.shape[0], capacity, tensor.shape[2])
        bigger[:, : tensor.shape[1]] = tensor
        return bigger

    @property
    def _activation_dtype(self) -> torch.dtype:
        return self.embed.weight.dtype if hasattr(self.embed, "weight") else self.embed.dtype

    def _tables(self, capacity: int) -> None:
        """cos and sin [capacity, head_dim] of every rotary table the layers use (Gemma-3: one for its global
        layers, one for its local ones; else one, under None)."""
        known = next(iter(self._cos.values()), None)
        if known is not None and known.shape[0] >= capacity:
            return
        positions = torch.arange(capacity, device=self.device).unsqueeze(0)
        probe = torch.zeros(1, dtype=self._activation_dtype, device=self.device)
        for rope_type in dict.fromkeys(self.rope_types):  # the model's own rotary module: the same values
            cos, sin = rope.tables(self.rotary, probe, positions, rope_type)  # LongRoPE: per position
            self._cos[rope_type], self._sin[rope_type] = cos[0], sin[0]

    def _causal_mask(self, start: int, fed: int, window: int | None = None) -> torch.Tensor | None:
        """[1, 1, fed, start+fed]: row i sees keys ≤ start+i, and with a window of N only the last N of them. A
        one-token step within its window needs none; a square table for the whole capacity would take capacity²
        floats (4 GB at 32k tokens). A windowed row reads every key from 0 on, the ones before its window masked, as
        a global layer's row reads the ones after it masked: a row then takes the same sums whether it is fed alone
        or with others (a slice starting at each row's window would shift them, and change their rounding)."""
        if fed == 1 and (window is None or start < window):
            return None
        ahead = (
            torch.arange(start + fed, device=self.device)[None, :]
            - torch.arange(start, start + fed, device=self.device)[:, None]
        )  # key position − row position
        blocked = ahead > 0
        if window is not None:
            blocked |= ahead <= -window
        lowest = torch.finfo(self._activation_dtype).min
        zero = torch.zeros((), dtype=self._activation_dtype, device=self.device)
        return torch.where(blocked, lowest, zero)[None, None]

    # ----- the forward --------------------------------------------------------------------------------
    @torch.inference_mode()
    def __call__(self, cache: LeanKVCache, input_ids: torch.Tensor, keep: int, head: bool = True) -> torch.Tensor:
        """Logits [keep, vocab] (or final hidden states) of the last `keep` positions fed. A long
        prompt is fed in pieces of model_io.PREFILL_CHUNK tokens: attention scores for n tokens at once take
        n² floats per head (43 GB for 30k tokens on the bundled target)."""
        tail = None
        for piece in input_ids.split(model_io.PREFILL_CHUNK, dim=1):
            hidden = self._decode(cache, piece, keep)
            tail = hidden if tail is None else torch.cat([tail, hidden], dim=1)[:, -keep:]
        if not head:
            return tail[0]
        cache.features = tail[0]  # kept for a draft head (model_io.features): no extra pass
        logits = self.head(tail)[0]
        if self.logit_cap is not None:  # Gemma's final soft-capping, as transformers computes it
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits

    def _decode(self, cache: LeanKVCache, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """The decoder layers over input_ids [1, fed] after the cache, then the final norm of the last
        `keep` rows (per row, so a prompt's pieces normed apart are normed alike): [1, min(keep, fed), hidden]."""
        start, fed = cache.length, input_ids.shape[1]
        cache.make_room(start + fed)
        self._tables(cache.capacity)
        cos = {key: table[start : start + fed] for key, table in self._cos.items()}  # [fed, head_dim] each
        sin = {key: table[start : start + fed] for key, table in self._sin.items()}
        hidden = self.embed(input_ids)  # [1, fed, hidden]
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        native = self.native_loop()
        if native is not None:  # causal (and windowed) by itself; the norm while the rows are in cache
            cos_rows, sin_rows = torch.stack(list(cos.values())), torch.stack(list(sin.values()))  # [tables, fed, dim]
            hidden = native.forward_tail(hidden, cache.keys, cache.values, cos_rows, sin_rows, start, keep)
        else:
            masks = {window: self._causal_mask(start, fed, window) for window in set(self.windows)}
            for index, layer in enumerate(self.layers):
                rope, window = self.rope_types[index], self.windows[index]
                hidden = self._layer(layer, cache, index, hidden, cos[rope], sin[rope], masks[window], start)
            hidden = rms_norm(self.norm, hidden[:, -keep:])
        cache.length = start + fed
        return hidden

    def _layer(self, layer, cache: LeanKVCache, index: int, hidden, cos, sin, mask, start: int):
        attention = layer.self_attn
        normed = rms_norm(layer.input_layernorm, hidden)
        fed = hidden.shape[1]
        widths = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        query, key, value = fused.parts(same_input(fused.qkv_layers(attention), normed), widths)  # Phi-3: one qkv_proj
        query = _heads(query, self.heads, getattr(attention, "q_norm", None))  # [heads, fed, head_dim]
        key = _heads(key, self.kv_heads, getattr(attention, "k_norm", None))
        value = _heads(value, self.kv_heads, None)
        query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
        end = start + fed
        cache.keys[index][:, start:end] = key
        cache.values[index][:, start:end] = value
        out, _ = batch_invariant_attention(
            attention,
            query[None],
            cache.keys[index][None, :, :end],
            cache.values[index][None, :, :end],
            mask,
            self.scaling,
            softcap=self.attention_cap,
        )
        out = attention.o_proj(out.reshape(1, fed, -1))
        sandwich = getattr(layer, "pre_feedforward_layernorm", None)  # Gemma: norms after attention and MLP too
        if sandwich is not None:
            out = rms_norm(layer.post_attention_layernorm, out)
        hidden = hidden + out
        mlp = layer.mlp
        normed = rms_norm(sandwich if sandwich is not None else layer.post_attention_layernorm, hidden)
        gate, up = fused.parts(same_input(fused.gate_up_layers(mlp), normed), [fused.gate_width(mlp)] * 2)
        out = mlp.down_proj(fused.activation(mlp)(gate) * up)
        if sandwich is not None:
            out = rms_norm(layer.post_feedforward_layernorm, out)
        return hidden + out


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama/Qwen2 RMSNorm module's output as torch's one fused op (one dispatch, not six; per row,
    so batch-invariant); any other norm module (Gemma's 1 + w) is called as it is."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or x.dtype != torch.float32:
        return norm(x)
    return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def _heads(x: torch.Tensor, count: int, norm: nn.Module | None) -> torch.Tensor:
    """A projection's rows [1, fed, count·head_dim] as heads [count, fed, head_dim], each head's vector first
    normed where the architecture norms them (Qwen3's q_norm and k_norm)."""
    heads = x.view(x.shape[1], count, -1)
    if norm is not None:
        heads = rms_norm(norm, heads)
    return heads.transpose(0, 1)


def same_input(layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of layers that all read x, fused where their kind allows (w4a8, w8a8)."""
    if isinstance(layers[0], w4a8.Q4Linear):
        return w4a8.same_input(layers, x)
    return w8a8.same_input(layers, x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [heads, fed, head_dim], as transformers' apply_rotary_pos_emb: where the
    tables are narrower than a head (partial_rotary_factor < 1: Phi-4-mini), its first part only, the rest as it is."""
    rotated_part = cos.shape[-1]
    if rotated_part < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotated_part], cos, sin), x[..., rotated_part:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def _window(attention: nn.Module, config) -> int | None:
    """The keys a layer's attention reads (a sliding window of N: the row's own and the N - 1 before), None: all.
    The attention module's own where it has one (Qwen2/3, Gemma: None on full layers), else the config's
    (Mistral's, on every layer)."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    return getattr(config, "sliding_window", None)


def _rope_types(rotary: nn.Module, config, count: int) -> list[str | None]:
    """Per layer, which of the rotary module's tables it takes: its layer type where the module keeps one a
    type (Gemma-3: local layers have their own base), else None (one table)."""
    types = getattr(config, "layer_types", None)
    if types and all(hasattr(rotary, f"{layer_type}_inv_freq") for layer_type in types[:count]):
        return list(types[:count])
    return [None] * count
