"""Bad shapes, strides, dtypes, devices and layer lists driven into every entry point of the compiled kernel
module (q4_linear, q4_linear_parts, top_p_probs, LeanLayers' constructor, add_layer, set_final_norm, forward,
forward_tail): each case must raise ValueError or RuntimeError, never return and never crash. The cases cycle
through the families below and through every code path of the product this CPU has.

Run in its own process (tests/kernels/test_kernel_shape_fuzz.py; scripts/asan_kernels.sh under AddressSanitizer),
so that a crash is a failed run, not a dead test session:

    python tests/kernels/shape_fuzz.py [--cases 1000] [--seed 0]

prints one JSON line: the cases run, those that raised as they should, per family, and each one that did not
(returned, or raised another type). Before each case its name goes to stderr, so a crash names the case.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from functools import cache

import torch

from specchat.quant.q4_block import Q4Block
from specchat.quant.q4_tiles import Q4Tiles

HEADS, KV_HEADS, HEAD_DIM, WIDTH, GATE = 4, 2, 16, 64, 64  # a tiny Llama-style layer the kernel takes
QKV_WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM
BYTES = {4: 256, 6: 384, 8: 512}  # qs bytes a tile's 32-group takes, by level bits
META = torch.device("meta")  # a tensor with no memory on the CPU: where the device checks matter

Case = Callable[[], object]


@cache
def _weight(outs: int, inputs: int, bits: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return Q4Tiles.from_block(Q4Block.quantize(torch.randn(outs, inputs, generator=generator) * 0.1, bits)).tensors()


def weight(outs: int, inputs: int, bits: int = 4, seed: int = 0) -> list[torch.Tensor]:
    """A valid w4a8 weight [outs, inputs] as the kernel takes it: qs, sc, m, d, dmin (copies, free to spoil)."""
    return [t.clone() for t in _weight(outs, inputs, bits, seed)]


def raw_weight(
    tiles: int, groups: int, blocks: int, qs_bytes: int = 256, m_pairs: int | None = None
) -> list[torch.Tensor]:
    """Weight tensors of the given sizes filled with random bytes (the kernel reads any values)."""

    def noise(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8)

    m_pairs = groups // 2 if m_pairs is None else m_pairs
    return [
        noise(tiles, groups, qs_bytes),
        noise(tiles, groups, 16),
        noise(tiles, m_pairs, 32),
        torch.rand(tiles, blocks, 16),
        torch.rand(tiles, blocks, 16),
    ]


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t's values in a strided view (every other element of a twice-as-long last dimension)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def other_dtype(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    choices = [
        torch.int8,
        torch.int16,
        torch.int32,
        torch.float16,
        torch.float64,
        torch.bfloat16,
        torch.uint8,
        torch.float32,
        torch.bool,
    ]
    return t.to(rng.choice([d for d in choices if d != t.dtype]))


def other_rank(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    options = [t.unsqueeze(0), t.reshape(-1), t.reshape(1, *t.shape, 1), t.reshape(1, -1)]
    return rng.choice([o for o in options if o.dim() != t.dim()])


def on_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=META)


ALL = ("dtype", "rank", "strides", "device")
COPIED = ("dtype", "rank", "device")  # what the entry point copies to contiguous itself may come strided


def spoiled(t: torch.Tensor, rng: random.Random, kinds: tuple[str, ...] = ALL) -> tuple[str, torch.Tensor]:
    """t with one thing wrong (one of `kinds`) that no check may let pass: its dtype, rank, strides or device."""
    kind = rng.choice(kinds)
    if kind == "dtype":
        return kind, other_dtype(t, rng)
    if kind == "rank":
        return kind, other_rank(t, rng)
    if kind == "strides" and t.dim() and t.shape[-1] > 1:
        return kind, non_contiguous(t)
    return "device", on_meta(t)


# ----- the w4a8 product: q4_linear, q4_linear_parts -----


def q4_groups_per_block(kernel, rng):
    """Blocks of more than 8 32-groups (past the 256-input blocks the 256-bit paths' stack room holds), an
    odd number past one, none, or groups that do not split into the blocks."""
    per_block, blocks = rng.choice(
        [
            (rng.choice([10, 12, 16, 24, 32, 64]), rng.choice([1, 2, 3])),
            (rng.choice([3, 5, 7]), rng.choice([1, 2])),
            (None, 0),
            (None, 3),
        ]
    )
    groups = per_block * blocks if per_block else rng.choice([4, 8, 16]) if blocks else 8
    if per_block is None and blocks == 3:
        groups = rng.choice([4, 8, 10])  # not a multiple of 3
    tiles, rows = rng.randint(1, 3), rng.randint(1, 40)
    w = raw_weight(tiles, groups, blocks, m_pairs=max(1, groups // 2) if groups % 2 else None)
    x = torch.randn(rows, groups * 32)
    return f"per_block={per_block} blocks={blocks} groups={groups} rows={rows}", lambda: kernel.q4_linear(x, *w)


def q4_no_groups(kernel, rng):
    """Weights and x 0 inputs wide."""
    blocks, rows = rng.randint(1, 4), rng.randint(0, 5)
    w = raw_weight(rng.randint(1, 2), 0, blocks)
    x = torch.randn(rows, 0)
    return f"blocks={blocks} rows={rows}", lambda: kernel.q4_linear(x, *w)


def q4_x_width(kernel, rng):
    w = weight(32, 512, rng.choice([4, 6, 8]))
    width = rng.choice([0, 32, 448, 480, 544, 576, 1024])
    x = torch.randn(rng.randint(1, 20), width)
    return f"x {tuple(x.shape)} against 512 inputs", lambda: kernel.q4_linear(x, *w)


def q4_bad_x(kernel, rng):
    w = weight(32, 256)
    kind, x = spoiled(torch.randn(rng.randint(1, 9), 256), rng, COPIED)
    return f"x {kind} {x.dtype} {tuple(x.shape)}", lambda: kernel.q4_linear(x, *w)


def q4_spoiled_tensor(kernel, rng):
    """One of the five weight tensors of the wrong dtype, rank, strides or device."""
    w = weight(48, 512, rng.choice([4, 6, 8]))
    which = rng.randrange(5)
    kind, w[which] = spoiled(w[which], rng)
    x = torch.randn(rng.randint(1, 40), 512)
    return f"tensor {which} {kind}", lambda: kernel.q4_linear(x, *w)


def q4_wrong_size(kernel, rng):
    """One dimension of one tensor off (qs's bytes a group: never to another level width)."""
    w = weight(48, 512, rng.choice([4, 6, 8]))
    which, dim = rng.randrange(5), rng.randrange(3)
    shape = list(w[which].shape)
    if which == 0 and dim == 2:
        shape[2] = rng.choice([0, 16, 100, 255, 257, 320, 640, 1024])
    else:
        shape[dim] = max(0, shape[dim] + rng.choice([-2, -1, 1, 2, shape[dim]]))
        if shape[dim] == w[which].shape[dim]:
            shape[dim] += 1
    w[which] = torch.zeros(shape, dtype=w[which].dtype)
    x = torch.randn(rng.randint(1, 40), 512)
    return f"tensor {which} {tuple(shape)}", lambda: kernel.q4_linear(x, *w)


def q4_consistent_but_not_a_layout(kernel, rng):
    """Tensors that agree with each other, but in a shape no layout has (qs bytes, m pairs, tile rows)."""
    tiles, groups, blocks = rng.randint(1, 3), rng.choice([2, 4, 8, 16]), 1
    kind = rng.choice(["bytes", "m", "rows"])
    w = raw_weight(tiles, groups, blocks, qs_bytes=rng.choice([128, 200, 768]) if kind == "bytes" else 256)
    if kind == "m":
        w[2] = torch.zeros(tiles, groups, 16, dtype=torch.uint8)
    if kind == "rows":
        w = (
            [t[..., :8].contiguous() for t in w[:2]]
            + [w[2][..., :16].contiguous()]
            + [t[..., :8].contiguous() for t in w[3:]]
        )
    x = torch.randn(rng.randint(1, 20), groups * 32)
    return f"{kind} tiles={tiles} groups={groups}", lambda: kernel.q4_linear(x, *w)


def q4_outs(kernel, rng):
    tiles = rng.randint(1, 4)
    w = weight(16 * tiles, 256)
    padded = 16 * tiles
    outs = rng.choice([padded + 1, padded + 17, 2**40, padded - 16, padded - 16 - rng.randint(1, 9), 0])
    if outs < 0:
        outs = 0 if padded > 16 else padded + 1
    x = torch.randn(rng.randint(1, 8), 256)
    return f"outs={outs} of {padded}", lambda: kernel.q4_linear(x, *w, outs)


def q4_parts(kernel, rng):
    """q4_linear_parts with no weight, a weight of 4 or 6 tensors, or a bad weight after good ones."""
    good = [weight(16 * rng.randint(1, 3), 512, bits) for bits in rng.sample([4, 6, 8], rng.randint(1, 3))]
    x = torch.randn(rng.randint(1, 20), 512)
    kind = rng.choice(["none", "count", "bad"])
    if kind == "none":
        return kind, lambda: kernel.q4_linear_parts(x, [])
    if kind == "count":
        bad = weight(16, 512)
        bad = bad[:4] if rng.random() < 0.5 else bad + [bad[4].clone()]
    else:
        bad = weight(16, rng.choice([256, 1024]))  # another input width
        if rng.random() < 0.5:
            bad = weight(16, 512)
            which = rng.randrange(5)
            _, bad[which] = spoiled(bad[which], rng)
    parts = good[:]
    parts.insert(rng.randint(0, len(good)), bad)
    return f"{kind} among {len(good)} good", lambda: kernel.q4_linear_parts(x, parts)


# ----- sampling's probabilities: top_p_probs -----


def sampling_shape(kernel, rng):
    kind = rng.choice(["empty", "spoiled"])
    if kind == "empty":
        logits = torch.randn(rng.randint(1, 3), 0)
    else:
        kind, logits = spoiled(torch.randn(rng.randint(1, 4), rng.randint(1, 300)), rng, COPIED)
    top_p = rng.choice([1.0, 0.9, 0.5])
    return f"{kind} {logits.dtype} {tuple(logits.shape)} top_p={top_p}", lambda: kernel.top_p_probs(
        logits, 0.7, 0, top_p
    )


def sampling_settings(kernel, rng):
    nan, inf = float("nan"), float("inf")
    temperature, top_k, top_p = 0.7, 0, 0.9
    which = rng.choice(["temperature", "top_k", "top_p"])
    if which == "temperature":
        temperature = rng.choice([0.0, -1.0, nan, inf, -inf, -1e-30])
    elif which == "top_k":
        top_k = rng.choice([-1, -100, -(2**40)])
    else:
        top_p = rng.choice([0.0, -0.1, 1.5, nan, inf, -inf])
    logits = torch.randn(rng.randint(1, 4), rng.randint(1, 300))
    return f"T={temperature} k={top_k} p={top_p}", lambda: kernel.top_p_probs(logits, temperature, top_k, top_p)


# ----- the layer loop: LeanLayers -----


class Model:
    """Two valid layers' arguments for add_layer and a valid forward's, each a fresh copy to spoil."""

    def __init__(self, rng: random.Random, layers: int = 2):
        self.layers = [self.layer(rng, seed) for seed in range(layers)]
        self.fed, self.start, self.capacity = rng.randint(1, 6), rng.randint(0, 4), 16
        self.hidden = torch.randn(1, self.fed, WIDTH)
        self.keys = [torch.zeros(KV_HEADS, self.capacity, HEAD_DIM) for _ in range(layers)]
        self.values = [torch.zeros(KV_HEADS, self.capacity, HEAD_DIM) for _ in range(layers)]
        self.cos, self.sin = torch.rand(self.fed, HEAD_DIM), torch.rand(self.fed, HEAD_DIM)
        self.final_norm = torch.ones(WIDTH)

    @staticmethod
    def layer(rng: random.Random, seed: int) -> dict:
        bias = rng.random() < 0.5
        return {
            "input_norm": torch.ones(WIDTH),
            "post_norm": torch.ones(WIDTH),
            "eps": 1e-6,
            "qkv": [
                weight(HEADS * HEAD_DIM, WIDTH, seed=seed),
                weight(KV_HEADS * HEAD_DIM, WIDTH, seed=seed + 1),
                weight(KV_HEADS * HEAD_DIM, WIDTH, seed=seed + 2),
            ],
            "qkv_bias": torch.zeros(QKV_WIDTH) if bias else None,
            "out": weight(WIDTH, HEADS * HEAD_DIM, seed=seed + 3),
            "out_bias": torch.zeros(WIDTH) if bias else None,
            "gate_up": [weight(GATE, WIDTH, seed=seed + 4), weight(GATE, WIDTH, seed=seed + 5)],
            "gate_up_bias": torch.zeros(2 * GATE) if bias else None,
            "gate_width": GATE,
            "down": weight(WIDTH, GATE, seed=seed + 6),
            "down_bias": torch.zeros(WIDTH) if bias else None,
        }

    def build(self, kernel, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM):
        native = kernel.LeanLayers(heads, kv_heads, head_dim, 0.25)
        for layer in self.layers:
            native.add_layer(*layer.values())
        native.set_final_norm(self.final_norm, 1e-6)
        return native

    def run(self, kernel, tail: bool = True, **built):
        native = self.build(kernel, **built)
        arguments = (self.hidden, self.keys, self.values, self.cos, self.sin, self.start)
        return native.forward_tail(*arguments, 2) if tail else native.forward(*arguments)


def lean_constructor(kernel, rng):
    heads, kv_heads, head_dim = rng.choice(
        [
            (0, 1, 16),
            (4, 3, 16),
            (4, 0, 16),
            (-4, -2, 16),
            (4, 2, 0),
            (4, 2, -16),
            (4, 2, 8),
            (4, 2, 24),
            (2**40, 1, 16),
            (4, 2, 2**40),
            (4, 8, 16),
        ]
    )
    return f"heads={heads} kv={kv_heads} dim={head_dim}", lambda: kernel.LeanLayers(heads, kv_heads, head_dim, 0.25)


def lean_norm(kernel, rng):
    """A norm of any layer (not only the first) the wrong width, dtype, rank, strides or device."""
    model = Model(rng)
    index, which = rng.randrange(2), rng.choice(["input_norm", "post_norm"])
    if rng.random() < 0.4:
        model.layers[index][which] = torch.ones(WIDTH + rng.choice([-56, -16, -8, 8, 16, 64]))
        kind = f"width {model.layers[index][which].shape[0]}"
    else:
        kind, model.layers[index][which] = spoiled(model.layers[index][which], rng)
    return f"layer {index} {which} {kind}", lambda: model.run(kernel, tail=rng.random() < 0.5)


def lean_projection_width(kernel, rng):
    """o_proj or down (whose outputs are added into the rows with their stride), q/k/v or gate/up with the
    wrong outputs or inputs, in any layer."""
    model = Model(rng)
    index = rng.randrange(2)
    layer = model.layers[index]
    which = rng.choice(["out", "down", "qkv", "gate_up"])
    outs, inputs = {
        "out": (WIDTH, HEADS * HEAD_DIM),
        "down": (WIDTH, GATE),
        "qkv": (KV_HEADS * HEAD_DIM, WIDTH),
        "gate_up": (GATE, WIDTH),
    }[which]
    if rng.random() < 0.6:
        outs = rng.choice([o for o in (16, 32, 48, 80, 96, 128) if o != outs])
    else:
        inputs = rng.choice([i for i in (128, 192, 256) if i != inputs])
    bad = weight(outs, inputs, seed=index)
    if which in ("out", "down"):
        layer[which] = bad
    else:
        layer[which][rng.randrange(len(layer[which]))] = bad
    layer[f"{which}_bias"] = None  # the weight itself must be refused, not its bias's size
    return f"layer {index} {which} [{outs}, {inputs}]", lambda: model.run(kernel, tail=rng.random() < 0.5)


def lean_gate_width(kernel, rng):
    model = Model(rng)
    index = rng.randrange(2)
    model.layers[index]["gate_width"] = rng.choice([0, -8, 60, 32, 128, 63, 2**40])
    return f"layer {index} gate_width {model.layers[index]['gate_width']}", lambda: model.run(kernel)


def lean_bias(kernel, rng):
    model = Model(rng)
    index, which = rng.randrange(2), rng.choice(["qkv_bias", "out_bias", "gate_up_bias", "down_bias"])
    size = {"qkv_bias": QKV_WIDTH, "out_bias": WIDTH, "gate_up_bias": 2 * GATE, "down_bias": WIDTH}[which]
    kind = rng.choice(["size", "2-d", "0-d", "spoiled"])
    if kind == "size":
        bias = torch.zeros(size + rng.choice([-16, -8, 8, 16, size]))
    elif kind == "2-d":
        bias = torch.zeros(size, rng.choice([1, 2]))
    elif kind == "0-d":
        bias = torch.tensor(0.0)
    else:
        kind, bias = spoiled(torch.zeros(size), rng, ("dtype", "device"))  # copied to contiguous when added
    model.layers[index][which] = bias
    return f"layer {index} {which} {kind} {tuple(bias.shape)}", lambda: model.run(kernel, tail=rng.random() < 0.5)


def lean_weight_lists(kernel, rng):
    """A projection of no weight, a weight of 4 or 6 tensors, or one of its tensors spoiled."""
    model = Model(rng)
    index, which = rng.randrange(2), rng.choice(["qkv", "gate_up", "out", "down"])
    layer = model.layers[index]
    kind = rng.choice(["empty", "count", "spoiled"] if which in ("qkv", "gate_up") else ["count", "spoiled"])
    if kind == "empty":
        layer[which] = []
        layer[f"{which}_bias"] = None
        return f"layer {index} {which} empty", lambda: model.run(kernel)
    target = layer[which][rng.randrange(len(layer[which]))] if which in ("qkv", "gate_up") else layer[which]
    if kind == "count":
        if rng.random() < 0.5:
            target.pop()
        else:
            target.append(target[0].clone())
    else:
        position = rng.randrange(5)
        kind, target[position] = spoiled(target[position], rng)
    return f"layer {index} {which} {kind}", lambda: model.run(kernel)


def lean_forward_inputs(kernel, rng):
    """forward's hidden rows, caches, rotary tables and start, each wrong in turn."""
    model = Model(rng)
    kind = rng.choice(
        [
            "hidden",
            "hidden width",
            "cache list",
            "cache",
            "cache shape",
            "cache dtypes",
            "table",
            "table shape",
            "start",
        ]
    )
    if kind == "hidden":
        kind, model.hidden = spoiled(model.hidden, rng, COPIED)
    elif kind == "hidden width":
        model.hidden = torch.randn(
            rng.choice([(1, model.fed, 56), (1, model.fed, 128), (2, model.fed, WIDTH), (1, model.fed, 72)])
        )
    elif kind == "cache list":
        chosen = rng.choice([model.keys, model.values])
        chosen.pop() if rng.random() < 0.5 else chosen.append(chosen[0].clone())
    elif kind == "cache":
        chosen = rng.choice([model.keys, model.values])
        index = rng.randrange(len(chosen))
        kind, chosen[index] = spoiled(chosen[index], rng)  # one cache alone in 16 bits is not "all alike"
    elif kind == "cache shape":
        chosen = rng.choice([model.keys, model.values])
        index = rng.randrange(len(chosen))
        shape = rng.choice(
            [
                (KV_HEADS + 1, 16, HEAD_DIM),
                (1, 16, HEAD_DIM),
                (KV_HEADS, 16, 32),
                (KV_HEADS, 16, 8),
                (KV_HEADS, model.start + model.fed - 1, HEAD_DIM),
            ]
        )
        chosen[index] = torch.zeros(shape)
    elif kind == "cache dtypes":
        model.values = [v.to(rng.choice([torch.float16, torch.bfloat16])) for v in model.values]
    elif kind == "table":
        which = rng.choice(["cos", "sin"])
        kind, bad = spoiled(getattr(model, which), rng)
        setattr(model, which, bad)
    elif kind == "table shape":
        which = rng.choice(["cos", "sin"])
        setattr(model, which, torch.rand(rng.choice([(model.fed + 1, HEAD_DIM), (model.fed, 8), (model.fed, 32)])))
    else:
        model.start = rng.choice(
            [-1, -(2**40), model.capacity, model.capacity - model.fed + 1, 2**62, 2**63 - 1, 2**63 - model.fed]
        )
    return kind, lambda: model.run(kernel, tail=rng.random() < 0.5)


def lean_resized_after_adding(kernel, rng):
    """Tensors the layers hold, resized in place after add_layer: the checks run again on every forward."""
    model = Model(rng)
    native = model.build(kernel)
    index = rng.randrange(2)
    layer = model.layers[index]
    kind = rng.choice(["norm", "bias", "out tiles", "down tiles", "final norm"])
    if kind == "norm":
        layer[rng.choice(["input_norm", "post_norm"])].resize_(rng.choice([8, 32, 56]))
    elif kind == "bias":
        for name in ("out_bias", "down_bias"):
            if layer[name] is None:
                layer[name] = torch.zeros(WIDTH)  # added anew below, to be resized after
        native = model.build(kernel)
        layer[rng.choice(["out_bias", "down_bias"])].resize_(rng.choice([8, 16, 48]))
    elif kind == "final norm":
        model.final_norm.resize_(rng.choice([8, 32, 56]))
    else:  # all five tensors of o_proj or down to fewer tiles, alike: only the layer's width check sees it
        tensors = layer["out" if kind == "out tiles" else "down"]
        tiles = rng.choice([1, 2, 3])
        for t in tensors:
            t.resize_(tiles, *t.shape[1:])
    arguments = (model.hidden, model.keys, model.values, model.cos, model.sin, model.start)
    tail = kind == "final norm" or rng.random() < 0.5
    return f"layer {index} {kind}", lambda: native.forward_tail(*arguments, 1) if tail else native.forward(*arguments)


def lean_final_norm(kernel, rng):
    """The final norm wrong, or forward_tail asked for nothing, or with no final norm, or layers of
    another width after it, or no layers and hidden rows of another width than the final norm."""
    model = Model(rng)
    kind = rng.choice(["norm", "keep", "unset", "layers after", "no layers"])
    arguments = (model.hidden, model.keys, model.values, model.cos, model.sin, model.start)
    if kind == "norm":
        model.final_norm = rng.choice([torch.ones(WIDTH + 8), torch.ones(WIDTH - 8)])
        if rng.random() < 0.5:
            _, model.final_norm = spoiled(torch.ones(WIDTH), rng)  # 1-dimensional: another rank has 2 or more
        return kind, lambda: model.run(kernel)
    if kind == "keep":
        keep = rng.choice([0, -1, -(2**40)])
        return kind, lambda: model.build(kernel).forward_tail(*arguments, keep)
    if kind == "unset":

        def unset():
            native = kernel.LeanLayers(HEADS, KV_HEADS, HEAD_DIM, 0.25)
            for layer in model.layers:
                native.add_layer(*layer.values())
            return native.forward_tail(*arguments, 1)

        return kind, unset
    if kind == "layers after":

        def layers_after():
            native = kernel.LeanLayers(HEADS, KV_HEADS, HEAD_DIM, 0.25)
            native.set_final_norm(torch.ones(WIDTH + 64), 1e-6)
            for layer in model.layers:
                native.add_layer(*layer.values())
            return native.forward_tail(*arguments, 1)

        return kind, layers_after

    def no_layers():
        native = kernel.LeanLayers(HEADS, KV_HEADS, HEAD_DIM, 0.25)
        native.set_final_norm(torch.ones(rng.choice([8, 32, 56])), 1e-6)
        return native.forward_tail(model.hidden, [], [], model.cos, model.sin, 0, 1)

    return kind, no_layers


def lean_gemma_parts(kernel, rng):
    """Gemma's additions: sandwich norms of the wrong width, dtype, rank, strides or device (or resized after adding),
    a negative window or rotary table, a table the forward's cos and sin do not have, an unknown activation, a
    negative soft-cap, or any of them before a layer."""
    model = Model(rng)
    kind = rng.choice(["sandwich", "resized sandwich", "window", "table", "activation", "softcap", "no layer"])
    if kind == "no layer":
        native = kernel.LeanLayers(HEADS, KV_HEADS, HEAD_DIM, 0.25)
        call = rng.choice(
            [
                lambda: native.add_sandwich_norms(torch.ones(WIDTH), torch.ones(WIDTH)),
                lambda: native.set_layer_attention(8, 0),
            ]
        )
        return kind, call
    native = model.build(kernel)
    if kind == "sandwich":
        norms = [torch.ones(WIDTH), torch.ones(WIDTH)]
        index = rng.randrange(2)
        if rng.random() < 0.5:
            norms[index] = torch.ones(rng.choice([WIDTH - 8, WIDTH + 8, HEAD_DIM]))
        else:
            kind, norms[index] = spoiled(norms[index], rng)
        return f"sandwich {kind}", lambda: native.add_sandwich_norms(*norms)
    if kind == "resized sandwich":
        norm = torch.ones(WIDTH)
        native.add_sandwich_norms(norm, torch.ones(WIDTH))
        norm.resize_(WIDTH - 8)
    elif kind == "window":
        return kind, lambda: native.set_layer_attention(*rng.choice([(-1, 0), (8, -1), (-(2**40), 0)]))
    elif kind == "table":
        tables = rng.choice([1, 2])  # a layer taking one past them
        native.set_layer_attention(rng.choice([0, 4]), rng.choice([tables, tables + 1, 2**40]))
        if tables == 2:
            model.cos, model.sin = (table.expand(2, -1, -1).contiguous() for table in (model.cos, model.sin))
    elif kind == "activation":
        return kind, lambda: native.set_activation(rng.choice(["gelu", "", "relu", "SILU"]))
    else:
        return kind, lambda: native.set_softcap(rng.choice([-1.0, -(2.0**-20)]))
    arguments = (model.hidden, model.keys, model.values, model.cos, model.sin, model.start)
    return kind, lambda: native.forward_tail(*arguments, 1) if rng.random() < 0.5 else native.forward(*arguments)


FAMILIES = [
    q4_groups_per_block,
    q4_no_groups,
    q4_x_width,
    q4_bad_x,
    q4_spoiled_tensor,
    q4_wrong_size,
    q4_consistent_but_not_a_layout,
    q4_outs,
    q4_parts,
    sampling_shape,
    sampling_settings,
    lean_constructor,
    lean_norm,
    lean_projection_width,
    lean_gate_width,
    lean_bias,
    lean_weight_lists,
    lean_forward_inputs,
    lean_resized_after_adding,
    lean_final_norm,
    lean_gemma_parts,
]


def controls(kernel, rng: random.Random) -> None:
    """The valid inputs the cases spoil run without an error on every path (else every case would raise for
    the same wrong reason): a product of 256-input blocks for 1 to 40 rows, several at once, the layer loop, a
    row's probabilities."""
    for path in kernel.kernel_paths():
        kernel.set_kernel_path(path)
        for bits in (4, 6, 8):
            w = weight(48, 512, bits)
            for rows in (1, 2, 3, 5, 17, 40):
                assert kernel.q4_linear(torch.randn(rows, 512), *w).shape == (rows, 48)
        assert kernel.q4_linear_parts(torch.randn(3, 512), [weight(16, 512), weight(32, 512, 6)]).shape == (3, 48)
        model = Model(rng)
        assert model.run(kernel, tail=False).shape == (1, model.fed, WIDTH)
        assert Model(rng).run(kernel).shape[2] == WIDTH
        assert Model(rng, layers=0).run(kernel).shape[2] == WIDTH
        assert gemma_control(kernel, Model(rng)).shape[2] == WIDTH
        assert kernel.top_p_probs(torch.randn(3, 300), 0.7, 5, 0.9).shape == (3, 300)


def gemma_control(kernel, model: Model) -> torch.Tensor:
    """The valid Gemma additions: sandwich norms, a window, a second rotary table, GELU-tanh, a soft-cap."""
    native = model.build(kernel)
    native.add_sandwich_norms(torch.ones(WIDTH), torch.ones(WIDTH))
    native.set_layer_attention(2, 1)
    native.set_activation("gelu_tanh")
    native.set_softcap(5.0)
    cos, sin = (table.expand(2, -1, -1).contiguous() for table in (model.cos, model.sin))
    return native.forward_tail(model.hidden, model.keys, model.values, cos, sin, model.start, 1)


def run(kernel, cases: int, seed: int) -> dict:
    """The controls, then every case, its family and code path in turn; what each did."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    paths = list(kernel.kernel_paths())
    controls(kernel, rng)
    raised, families, failures = 0, Counter(), []
    for index in range(cases):
        family, path = FAMILIES[index % len(FAMILIES)], paths[index // len(FAMILIES) % len(paths)]
        kernel.set_kernel_path(path)
        what, call = family(kernel, rng)
        name = f"#{index} {family.__name__} [{path}] {what}"
        print(name, file=sys.stderr, flush=True)
        families[family.__name__] += 1
        try:
            call()
        except (ValueError, RuntimeError) as err:
            raised += 1 if str(err).strip() else 0
            if not str(err).strip():
                failures.append(f"{name}: {type(err).__name__} without a message")
        except Exception as err:
            failures.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        else:
            failures.append(f"{name}: returned without an error")
    return {"cases": cases, "raised": raised, "paths": paths, "families": dict(families), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from specchat.kernels.build import q4_kernel

    print(json.dumps(run(q4_kernel(), args.cases, args.seed)))


if __name__ == "__main__":
    main()
