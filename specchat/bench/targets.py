"""Target quantizations compared: fidelity to the float32 target and the cost of verifying.

    python -m specchat.bench.targets [--config FILE] [--modes none,int8,w8a8] [--tokens 2048] [--no-times]
    python -m specchat.bench.targets --gguf FILE [--modes w4a8] [--tokens 512] [--llamacpp]
    python -m specchat.bench.targets --kv-cache [--tokens 4096]

For each quantization of the configured target (loaded in its configured dtype) it prints:
- top-1 agreement and mean KL(float32 ‖ quantized) of next-token distributions, teacher-forced over
  a fixed text of code and prose (this package's README and engine source);
- the time of one forward of 1 token and of gamma+1 tokens after a 256-token context, and their
  ratio T(gamma+1)/T(1): what verifying a whole draft costs against one target-only step.
With --gguf FILE (a .gguf file or bundled:NAME as the target; --modes then defaults to w4a8, and nothing is
timed): the file's own dequantized float32 model against its w4a8 one, after a line naming the types of its
linear layers' tensors, which the kernel holds as they are and which it requantizes (loading/gguf/blocks.py).
With --llamacpp as well (llama-cpp-python installed): llama.cpp's own forward of the same file on the same ids,
against the same reference, in a last line.
With --kv-cache, instead: the configured target with its keys and values stored as float16, then bfloat16,
against the same model storing them as float32 (runtime.kv_cache), top-1 agreement and mean KL.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from specchat.config import QUANTIZATIONS, ConfigError
from specchat.errors import ModelLoadError
from specchat.settings import load_config
from specchat.speculative.model_io import crop_to, forward, new_kv_cache

TEXT_FILES = ("README.md", "specchat/speculative/engine.py")
CHUNK = 256
VERIFY_ROWS = (1, 5, 9)


def fixed_text() -> str:
    root = Path(__file__).resolve().parents[2]
    return "\n\n".join((root / name).read_text(encoding="utf-8") for name in TEXT_FILES if (root / name).exists())


@torch.inference_mode()
def next_token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log-softmax of the next-token logits at every position of `ids`, fed in chunks ([n, vocab])."""
    cache, rows = new_kv_cache(model), []
    for start in range(0, len(ids), CHUNK):
        piece = ids[start : start + CHUNK]
        logits = forward(model, cache, piece, keep=len(piece))  # the lean forward where attached
        rows.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return torch.cat(rows)


def agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """(top-1 agreement, mean KL(reference ‖ other)) of two [n, vocab] log-prob tables."""
    width = min(reference.shape[1], other.shape[1])
    reference, other = reference[:, :width], other[:, :width]
    top1 = (reference.argmax(-1) == other.argmax(-1)).float().mean().item()
    kl = (reference.exp() * (reference - other)).sum(-1).mean().item()
    return top1, kl


@torch.inference_mode()
def forward_ms(model, ids: list[int], rows: int, repeats: int = 7) -> float:
    """Median ms of one forward of `rows` tokens after a 256-token context (the cache cut back each time)."""
    cache = new_kv_cache(model)
    forward(model, cache, ids[:CHUNK], keep=1)
    piece = ids[CHUNK : CHUNK + rows]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward(model, cache, piece, keep=rows)
        times.append(time.perf_counter() - start)
        crop_to(cache, CHUNK)
    return sorted(times)[len(times) // 2] * 1e3


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.targets", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--modes", help="target quantizations to compare (default none,int8,w8a8; with --gguf: w4a8)")
    parser.add_argument("--tokens", type=int, default=2048, help="length of the teacher-forced text")
    parser.add_argument(
        "--gguf", metavar="FILE", help="the target: a .gguf file or bundled:NAME, against its own dequantized weights"
    )
    parser.add_argument("--no-times", action="store_true", help="fidelity only: time no forward")
    parser.add_argument(
        "--llamacpp", action="store_true", help="with --gguf: llama.cpp on the same file too (llama-cpp-python)"
    )
    parser.add_argument(
        "--kv-cache",
        action="store_true",
        help="instead: 16-bit keys and values against float32 ones, on the configured target",
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def compare(cfg, modes: list[str], tokens: int, say, times: bool = True, llamacpp: str | None = None) -> list[dict]:
    """Each mode's row against the float32 reference; llama.cpp's on the GGUF source `llamacpp` last, when given."""
    from specchat.loading.models import load_model

    reference_cfg = dataclasses.replace(cfg.target, dtype="float32", quantization="none")
    reference_model, tokenizer, _ = load_model(reference_cfg, role="reference target")
    ids = tokenizer.encode(fixed_text())[:tokens]
    say(f"float32 reference over {len(ids)} tokens")
    reference = next_token_logprobs(reference_model, ids)
    del reference_model
    results = _compare_modes(cfg, modes, ids, reference, say, times)
    if llamacpp is not None:
        top1, kl = agreement(reference, llamacpp_logprobs(llamacpp, ids))
        row = {"quantization": "llama.cpp", "dtype": "its own", "top1": top1, "kl": kl, "ms": None, "tokens": len(ids)}
        results.append(row)
        say(_line(row))
    return results


def llamacpp_logprobs(source: str, ids: list[int]) -> torch.Tensor:
    """llama.cpp's log-softmax of the next-token logits at every position of `ids` ([n, vocab]), fed in chunks, on
    the GGUF file of `source` (a bundled one assembled again: loading w4a8 drops the assembled file)."""
    import numpy as np
    from llama_cpp import Llama

    from specchat.bench.llamacpp import gguf_path

    path = gguf_path(source)

    threads = torch.get_num_threads()
    llama = Llama(
        model_path=str(path),
        n_ctx=len(ids) + 16,
        n_batch=CHUNK,
        logits_all=True,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    llama.eval(ids)
    scores = torch.from_numpy(np.array(llama.scores[: len(ids)], dtype=np.float32))
    return torch.log_softmax(scores, dim=-1)


def _compare_modes(cfg, modes: list[str], ids: list[int], reference: torch.Tensor, say, times: bool) -> list[dict]:
    from specchat.loading.models import load_model

    results = []
    for mode in modes:
        model, _, facts = load_model(
            dataclasses.replace(cfg.target, quantization=mode), role="target", kv_cache=cfg.runtime.kv_cache
        )
        top1, kl = agreement(reference, next_token_logprobs(model, ids))
        ms = {rows: forward_ms(model, ids, rows) for rows in VERIFY_ROWS} if times else None
        results.append(
            {
                "quantization": facts.quantization,
                "dtype": facts.dtype,
                "top1": top1,
                "kl": kl,
                "ms": ms,
                "tokens": len(ids),
            }
        )
        say(_line(results[-1]))
        del model
    return results


def compare_kv_caches(cfg, tokens: int, say) -> list[dict]:
    """The configured target's next-token log-probs with float16, then bfloat16, keys and values against
    float32 ones."""
    from specchat.bench.prefill import prompt_ids
    from specchat.loading.models import load_model
    from specchat.runtime.lean import attach_lean
    from specchat.speculative.model_io import runner

    model, tokenizer, facts = load_model(cfg.target, role="target", kv_cache="float32")
    if runner(model) is None or runner(model).native_reason:
        raise ConfigError(
            f"--kv-cache needs a target on the compiled layer loop (w4a8, float32); this one runs {facts.backend}"
        )
    ids = prompt_ids(tokenizer, fixed_text(), tokens)
    full, results = next_token_logprobs(model, ids), []
    for kind in ("float16", "bfloat16"):
        attach_lean(model, runner(model).native_layers, kind)
        top1, kl = agreement(full, next_token_logprobs(model, ids))
        results.append({"target": facts.name, "kv_cache": kind, "tokens": len(ids), "top1": top1, "kl": kl})
        say(
            f"{facts.name} ({facts.quantization}) over {len(ids)} tokens: {kind} keys and values against float32 · "
            f"top-1 {top1:.2%} · KL {kl:.5f}"
        )
    return results


def gguf_types(source: str) -> str:
    """A line on a GGUF source's linear-layer tensors: how many of each type, which the w4a8 kernel holds as they
    are, which it requantizes (to 6-bit levels; w4a8-fast: 4)."""
    from specchat.loading.gguf.blocks import as_stored, layer_kinds
    from specchat.loading.sources import resolve_source
    from specchat.quant.w4a8 import FINER_BITS

    found = resolve_source(source)
    if found.kind == "bundled":
        from specchat.loading.assets import bundled_gguf_path

        path = bundled_gguf_path(found.location)
    elif found.kind == "gguf":
        path = Path(found.location)
    else:
        raise ConfigError(f"--gguf takes a .gguf file or bundled:NAME, not {source}")
    kinds = layer_kinds(path)
    listed = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    held = sorted(kind for kind in kinds if as_stored(kind, FINER_BITS))
    other = sorted(kind for kind in kinds if not as_stored(kind, FINER_BITS))
    return (
        f"{found.name}: linear-layer tensors {listed}; w4a8 holds as stored: {', '.join(held) or 'none'}; "
        f"requantizes to {FINER_BITS}-bit levels: {', '.join(other) or 'none'}"
    )


def quantization_modes(text: str) -> list[str]:
    """--modes' comma-separated quantizations, each checked."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in QUANTIZATIONS for m in modes):
        raise ConfigError(f"--modes takes quantizations ({', '.join(QUANTIZATIONS)}), got '{text}'")
    return modes


def _line(r: dict) -> str:
    ms = r["ms"]
    if ms is None:
        return f"{r['quantization']:>14} {r['dtype']:>9} · top-1 {r['top1']:.1%} · KL {r['kl']:.2e} over {r['tokens']} tokens"
    ratios = " · ".join(f"T({rows})/T(1) {ms[rows] / ms[1]:.2f}" for rows in VERIFY_ROWS[1:])
    return (
        f"{r['quantization']:>14} {r['dtype']:>9} · top-1 {r['top1']:.1%} · KL {r['kl']:.4f} · "
        f"T(1) {ms[1]:.0f} ms · {ratios}"
    )


def _llamacpp_file(args) -> str:
    """The GGUF source llama.cpp reads for --llamacpp; ConfigError where it cannot."""
    from specchat.bench.llamacpp import gguf_path

    if not args.gguf:
        raise ConfigError("--llamacpp needs --gguf FILE: llama.cpp reads the same file")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise ConfigError('--llamacpp needs llama-cpp-python (pip install -e ".[llamacpp]")') from None
    if gguf_path(args.gguf) is None:
        raise ConfigError(f"--llamacpp: {args.gguf} is not a GGUF file")
    return args.gguf


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        overrides = [*args.overrides, f"target.source={args.gguf}"] if args.gguf else args.overrides
        cfg = load_config(args.config, overrides)
        modes = quantization_modes(args.modes or ("w4a8" if args.gguf else "none,int8,w8a8"))
        say = lambda line: print(line, flush=True)
        if args.kv_cache:
            compare_kv_caches(cfg, args.tokens, say)
        else:
            if args.gguf:
                say(gguf_types(args.gguf))
            llamacpp = _llamacpp_file(args) if args.llamacpp else None
            compare(cfg, modes, args.tokens, say, times=not (args.no_times or args.gguf), llamacpp=llamacpp)
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench targets: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
