"""The GPU check's bench: specchat against transformers' assisted generation on pairs built at real shapes.

    python -m specchat.bench.gpu --out DIR [--quick] [--device cuda] [--shapes 1.5b 7b]
                                 [--variants bf16 nf4 8bit float32] [--pairs small nf4-self self]
                                 [--new-tokens 64] [--prompts 3] [--work DIR]

For each target shape × variant × pair (synthetic.py builds the checkpoints, random weights), in one process:
specchat target-only, specchat γ4, transformers target-only and assisted generation γ4 (constant schedule) on the
same loaded models and prompts, greedy; whether speculative output equals target-only output (both tools); and
the target's forward time at 1, 5 and 9 rows (T(5)/T(1) should be about 1 on a GPU). Pairs: `small` (the shape's
small drafter), `nf4-self` (the target's own weights in bitsandbytes nf4: high acceptance, a real configuration),
`self` (the target drafting for itself: 100% greedy acceptance, the engine's overhead bound). It writes
DIR/gpu_bench.json (every measurement) and DIR/gpu_bench.md (the table). `--device cpu --shapes tiny
--variants float32` runs it on a CPU (tests/bench/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specchat.bench.methods import ASSISTED, Method, Runner
from specchat.bench.synthetic import SHAPES, checkpoint, prompt_ids
from specchat.config import Config, Mode, ModelConfig, SamplingConfig, SpeculationConfig
from specchat.errors import ModelLoadError
from specchat.loading.models import load_pair
from specchat.speculative import model_io

VARIANTS = {  # name -> (dtype, quantization) of the target
    "bf16": ("bfloat16", "none"),
    "nf4": ("bfloat16", "4bit"),
    "8bit": ("float16", "8bit"),
    "float32": ("float32", "none"),
}
SMALL_DRAFTER = {"tiny": "tiny", "0.5b": "0.5b", "1.5b": "0.5b", "7b": "0.5b"}
GAMMA = 4
METHODS = (
    Method("specchat target-only", "specchat", Mode.TARGET),
    Method("specchat γ4", "specchat", Mode.SPEC, GAMMA),
    Method("HF target-only", "hf", Mode.TARGET),
    Method("HF assisted γ4", "hf", ASSISTED, GAMMA),
)
QUICK = dict(shapes=["1.5b"], variants=["bf16"], pairs=["small", "self"], new_tokens=32, prompts=2)
FULL = dict(
    shapes=["1.5b", "7b"],
    variants=["bf16", "nf4", "8bit", "float32"],
    pairs=["small", "nf4-self", "self"],
    new_tokens=64,
    prompts=3,
)


@dataclass
class Row:
    shape: str
    variant: str
    pair: str
    tok_s: dict[str, float]  # method -> median tokens a second
    alpha: float | None  # specchat γ4's acceptance rate
    specchat_exact: str  # "k/n" replies where γ4 == target-only
    hf_exact: str  # "k/n" replies where assisted == target-only
    forward_ms: dict[str, float]  # rows -> median target forward ms at a 256-token context
    error: str = ""


def pair_config(target_dir: Path, drafter_dir: Path, variant: str, pair: str, device: str) -> Config:
    dtype, quantization = VARIANTS[variant]
    drafter_quant = "4bit" if pair == "nf4-self" else quantization
    return Config(
        target=ModelConfig(source=str(target_dir), dtype=dtype, quantization=quantization, device=device),
        drafter=ModelConfig(source=str(drafter_dir), dtype=dtype, quantization=drafter_quant, device=device),
        speculation=SpeculationConfig(mode=Mode.SPEC),
    )


def measure_pair(loaded, shape: str, variant: str, pair: str, args) -> Row:
    runner = Runner(loaded, list(METHODS), "")
    vocab = SHAPES[shape].vocab
    prompts = [prompt_ids(48, vocab, seed) for seed in range(args.prompts)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=args.new_tokens)
    for method in METHODS:  # warm-up: kernels chosen, caches allocated
        runner.measure_ids(method, prompts[0], SamplingConfig(temperature=0.0, max_new_tokens=8))
    results = {m.name: [runner.measure_ids(m, ids, sampling) for ids in prompts] for m in METHODS}
    tok_s = {name: statistics.median(r.tokens_per_s for r in runs) for name, runs in results.items()}
    accepted = [r.alpha for r in results["specchat γ4"] if r.alpha is not None]
    return Row(
        shape,
        variant,
        pair,
        tok_s,
        statistics.mean(accepted) if accepted else None,
        _agreement(results["specchat γ4"], results["specchat target-only"]),
        _agreement(results["HF assisted γ4"], results["HF target-only"]),
        forward_times(loaded.target, (1, GAMMA + 1, 9), args.repeats),
    )


def _agreement(spec, reference) -> str:
    same = sum(a.ids == b.ids for a, b in zip(spec, reference))
    return f"{same}/{len(reference)}"


def forward_times(model, rows: tuple[int, ...], repeats: int, context: int = 256) -> dict[str, float]:
    """Median ms of the target's forward of `rows` new tokens after `context` cached ones, device synced."""
    cache = model_io.new_kv_cache(model)
    device = model_io.input_device(model)
    model_io.forward(model, cache, list(range(1, context + 1)), keep=1)
    times = {}
    for count in rows:
        ids = torch.arange(1, count + 1, device=device).unsqueeze(0)
        samples = []
        for _ in range(repeats + 1):
            _sync(device)
            start = time.perf_counter()
            model_io.forward_tensor(model, cache, ids, keep=count)
            _sync(device)
            samples.append(time.perf_counter() - start)
            model_io.crop_to(cache, context)
        times[str(count)] = round(statistics.median(samples[1:]) * 1000, 3)
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(shape: str, variant: str, pair: str, args) -> Row:
    target_dir = checkpoint(shape, args.work, args.device)
    drafter_dir = (
        checkpoint(SMALL_DRAFTER[shape], args.work, args.device, seed=1) if pair == "small" else target_dir
    )  # seed 1: never the target's own weights, even at one shape
    try:
        loaded = load_pair(pair_config(target_dir, drafter_dir, variant, pair, args.device))
    except ModelLoadError as err:
        return Row(shape, variant, pair, {}, None, "", "", {}, error=str(err))
    try:
        return measure_pair(loaded, shape, variant, pair, args)
    finally:
        del loaded
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def table(rows: list[Row], device: str) -> str:
    """The markdown report: one line a pair, speeds as tokens a second, ratios side by side in one run."""
    head = (
        "| shape | target | pair | specchat target-only | specchat γ4 | γ4 ÷ own | HF target-only | HF assisted γ4 "
        "| specchat γ4 ÷ HF assisted | α | exact specchat | exact HF | T(1) ms | T(5) ms | T(9) ms | T(5)/T(1) |"
    )
    lines = [f"GPU bench on {device} (greedy; tok/s medians)", "", head, "|" + "---|" * 16]
    for r in rows:
        if r.error:
            lines.append(f"| {r.shape} | {r.variant} | {r.pair} | did not load: {r.error} |" + " |" * 12)
            continue
        s = r.tok_s
        f = r.forward_ms
        alpha = f"{r.alpha:.0%}" if r.alpha is not None else "—"
        lines.append(
            f"| {r.shape} | {r.variant} | {r.pair} | {s['specchat target-only']:.1f} | {s['specchat γ4']:.1f} "
            f"| {_ratio(s['specchat γ4'], s['specchat target-only'])} | {s['HF target-only']:.1f} "
            f"| {s['HF assisted γ4']:.1f} | {_ratio(s['specchat γ4'], s['HF assisted γ4'])} | {alpha} "
            f"| {r.specchat_exact} | {r.hf_exact} | {f['1']:.2f} | {f['5']:.2f} | {f['9']:.2f} "
            f"| {f['5'] / f['1']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_bench.json and gpu_bench.md")
    parser.add_argument("--work", type=Path, help="folder for the built checkpoints (default: OUT/models)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help=f"a first contact: {QUICK}")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS))
    parser.add_argument("--pairs", nargs="+", choices=["small", "nf4-self", "self"])
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--repeats", type=int, default=9, help="forwards timed per row count")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.work = args.work or args.out / "models"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes:
        for variant in args.variants:
            for pair in args.pairs:
                if pair == "nf4-self" and variant == "nf4":
                    continue  # the same model twice
                print(f"[gpu bench] {shape} {variant} {pair}", file=sys.stderr, flush=True)
                rows.append(run_one(shape, variant, pair, args))
    device = device_name(args.device)
    (args.out / "gpu_bench.json").write_text(
        json.dumps(
            {"device": device, "args": {k: str(v) for k, v in vars(args).items()}, "rows": [asdict(r) for r in rows]},
            indent=1,
        )
    )
    report = table(rows, device)
    (args.out / "gpu_bench.md").write_text(report)
    print(report)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
