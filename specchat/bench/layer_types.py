"""What verifying drafts costs on each stored type: the w4a8 kernel over one decoder layer's weights of a real
model's shape, T(1) and T(n)/T(1) per GGUF type, side by side in one run.

    python -m specchat.bench.profile --layer-types Q4_K Q4_0 Q8_0 [--shape 7b] [--rows 1 5 9] [--repeats 9]

Each type's blocks are random bytes with fixed float16 scales (the kernel's time does not depend on the values),
decoded as a file's are (loading/gguf/blocks.py), so no file and no model is needed: the figures are the kernel's
alone, a layer's q, k, v, o, gate, up and down in turn, the activations random rows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specchat.loading.gguf.blocks import AS_STORED
from specchat.quant.q4_tiles import Q4Tiles
from specchat.quant.w4a8 import run_kernel


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    ffn: int
    kv: int  # k's and v's output rows: kv heads × head width

    def weights(self) -> list[tuple[int, int]]:
        """(rows, inputs) of q, k, v, o, gate, up, down."""
        h, f = self.hidden, self.ffn
        return [(h, h), (self.kv, h), (self.kv, h), (h, h), (f, h), (f, h), (h, f)]


SHAPES = {
    "0.5b": LayerShape(896, 4864, 128),  # Qwen2.5-0.5B (the bundled drafter)
    "1.5b": LayerShape(1536, 8960, 256),  # Qwen2.5-1.5B (the bundled target)
    "7b": LayerShape(3584, 18944, 512),  # Qwen2.5-7B
    "8b": LayerShape(4096, 14336, 1024),  # Llama-3.1-8B
    "14b": LayerShape(5120, 13824, 1024),  # Qwen2.5-14B
    "tiny": LayerShape(256, 512, 64),  # to check the command in seconds
}
TYPES = tuple(AS_STORED)
# (bytes a block of 256 weights or of 32, (offset of each float16 scale in it))
BLOCK_BYTES = {
    "Q4_0": (18, (0,)),
    "Q4_1": (20, (0, 2)),
    "Q5_0": (22, (0,)),
    "Q5_1": (24, (0, 2)),
    "Q8_0": (34, (0,)),
    "IQ4_NL": (18, (0,)),
    "Q4_K": (144, (0, 2)),
    "Q5_K": (176, (0, 2)),
    "Q6_K": (210, (208,)),
    "IQ4_XS": (136, (0,)),
}
SCALE = 0.01  # the blocks' float16 d


def random_blocks(kind: str, rows: int, inputs: int, generator: torch.Generator) -> torch.Tensor:
    """uint8 [rows, blocks·bytes]: random `kind` blocks, d SCALE and any dmin SCALE / 2."""
    size, scales = BLOCK_BYTES[kind]
    per_block = 32 if size < 40 else 256
    raw = torch.randint(0, 256, (rows, inputs // per_block, size), dtype=torch.uint8, generator=generator)
    for index, offset in enumerate(scales):  # d SCALE, dmin half of it (a dmin equal to d would be left out)
        raw[..., offset : offset + 2] = torch.tensor([SCALE / (index + 1)], dtype=torch.float16).view(torch.uint8)
    return raw.view(rows, -1)


def layer_tiles(kind: str, shape: LayerShape, seed: int = 0) -> list[Q4Tiles]:
    generator = torch.Generator().manual_seed(seed)
    decode = AS_STORED[kind][1]
    return [Q4Tiles.from_block(decode(random_blocks(kind, r, i, generator))) for r, i in shape.weights()]


def layer_ms(product, tiles: list[Q4Tiles], rows: list[int], repeats: int) -> dict[int, float]:
    """Median ms of the layer's seven products on n random activation rows, for each n of `rows`, the counts taking
    turns within each repeat (a slow moment of the machine falls on all of them alike)."""
    inputs = {n: [torch.randn(n, t.sc.shape[1] * 32) for t in tiles] for n in rows}

    def once(n: int) -> float:
        start = time.perf_counter()
        for x, t in zip(inputs[n], tiles, strict=True):
            run_kernel(product, x, t)
        return time.perf_counter() - start

    for n in rows:  # warm: pages touched, threads up
        once(n)
    times: dict[int, list[float]] = {n: [] for n in rows}
    for _ in range(repeats):
        for n in rows:
            times[n].append(once(n))
    return {n: statistics.median(seconds) * 1e3 for n, seconds in times.items()}


def tiles_bytes(tiles: list[Q4Tiles]) -> int:
    return sum(t.nbytes for part in tiles for t in part.tensors())


def type_rows(product, kinds: list[str], shape: LayerShape, rows: list[int], repeats: int) -> list[dict]:
    """Per type: bits a weight as the kernel holds it, and T(n) for each n of `rows` (ms)."""
    weights = sum(r * i for r, i in shape.weights())
    results = []
    for kind in kinds:
        tiles = layer_tiles(kind, shape)
        results.append(
            {"type": kind, "bits": 8 * tiles_bytes(tiles) / weights, "ms": layer_ms(product, tiles, rows, repeats)}
        )
        del tiles
    return results


def types_table(results: list[dict], rows: list[int]) -> str:
    first = rows[0]
    ratios = [n for n in rows if n != first]
    head = f"| type | bits a weight held | T({first}) ms | " + " | ".join(f"T({n})/T({first})" for n in ratios) + " |"
    lines = [head, "|---" * (3 + len(ratios)) + "|"]
    for r in results:
        cells = " | ".join(f"{r['ms'][n] / r['ms'][first]:.2f}" for n in ratios)
        lines.append(f"| {r['type']} | {r['bits']:.2f} | {r['ms'][first]:.2f} | {cells} |")
    return "\n".join(lines)


def unknown_types(kinds: list[str]) -> list[str]:
    return [kind for kind in kinds if kind not in TYPES]
