"""Where a step's time goes: matmuls, attention, everything else, and the host-side verification.

    python -m specchat.bench.profile [--config FILE] [--gamma 4] [--context 256] [--repeats 9] [key=value ...]

For one decode step of the target (1 token), a verification forward of the target (gamma+1 tokens)
and one decode step of the drafter (1 token, with the drafter's restricted head as the chat runs it),
it prints the median time split by what ran, measured by timing hooks on the modules:
- matmuls: every linear layer (the head too), whatever its kind; for w8a8 and w4a8 layers, the
  kernel calls alone (fbgemm's int8 product, specchat's 4-bit one) are shown apart as "kernel";
- attention: the attention modules minus their projections (scores, softmax, rotary, cache writes);
  with the lean forward, which calls no attention module, the attention function alone (timed
  inside the compiled layer loop where w4a8 layers run in one C++ call);
- other: the rest of the forward (Python and dispatch, norms, embeddings, masks, cache bookkeeping).
Then the host-side work per step: greedy verification, and sampled verification (probabilities from
logits at T=0.7/top-p 0.9, the rejection rule) and the drafter's sampling of one token.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn

from specchat.config import ConfigError, SamplingConfig, load_config
from specchat.quant import w4a8, w8a8
from specchat.runtime import lean
from specchat.spec import model_io
from specchat.spec.drafters.vocab import DraftVocab
from specchat.spec.sampling import make_generator, pick, probs_from_logits
from specchat.spec.verify import verify_greedy, verify_sampled
from specchat.errors import ModelLoadError

PARTS = ("matmuls", "kernel", "attention", "other")
SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9)


class PartTimer:
    """Timing hooks: seconds inside linear layers, inside attention modules, and inside the linear
    layers that attention modules call (their projections), summed over every call."""

    def __init__(self, modules: list[nn.Module]):
        self.seconds: dict[str, float] = defaultdict(float)
        self._starts: dict[int, float] = {}
        self._in_attention = 0
        self.in_shared = 0  # inside w8a8.same_input, timed as a whole as "linear"
        self._handles = []
        for module in {id(m): m for root in modules for m in root.modules()}.values():
            kind = _kind(module)
            if kind:
                self._handles.append(module.register_forward_pre_hook(self._enter(kind)))
                self._handles.append(module.register_forward_hook(self._leave(kind)))

    def _enter(self, kind: str):
        def hook(module, _args) -> None:
            self._in_attention += kind == "attention"
            self._starts[id(module)] = time.perf_counter()
        return hook

    def _leave(self, kind: str):
        def hook(module, _args, _out) -> None:
            elapsed = time.perf_counter() - self._starts.pop(id(module))
            if kind == "linear" and self.in_shared:
                return
            self.seconds[kind] += elapsed
            if kind == "attention":
                self._in_attention -= 1
            elif self._in_attention:
                self.seconds["projections"] += elapsed
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _kind(module: nn.Module) -> str | None:
    """'linear' for any linear layer (torch, bitsandbytes, int8, w8a8), 'attention' for self-attention."""
    name = type(module).__name__
    if isinstance(module, nn.Linear) or name.endswith("Linear"):
        return "linear"
    if name.endswith("Attention"):
        return "attention"
    return None


@contextmanager
def timed_function(owner, name: str, seconds: dict[str, float], key: str, timer: PartTimer | None = None):
    """Count the time of calls to `owner.name` (a module-level function) into seconds[key]; with a
    timer, linear modules called inside are not counted again."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        if timer:
            timer.in_shared += 1
        try:
            return original(*args, **kwargs)
        finally:
            if timer:
                timer.in_shared -= 1
            seconds[key] += time.perf_counter() - start
    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def timed_calls(timer: PartTimer):
    """w8a8's and w4a8's kernel calls; the lean forward's attention (it calls no attention module) and
    its linear layers that share one input (they skip their modules' forward)."""
    seconds = timer.seconds
    with timed_function(w8a8, "_int8_product", seconds, "kernel"), \
            timed_function(w4a8, "run_kernel", seconds, "kernel"), \
            timed_function(lean, "batch_invariant_attention", seconds, "lean attention"), \
            timed_function(lean, "same_input", seconds, "linear", timer):
        yield


@contextmanager
def compiled_parts(modules: list[nn.Module], seconds: dict[str, float]):
    """The parts timed inside the lean forward's compiled layer loops (lean_layers.cpp), which no
    Python hook sees: their kernel, matmul and attention seconds are added to `seconds`."""
    leans = [getattr(module, model_io.RUNNER, None) for module in modules]
    loops = [loop for loop in (lean.native_loop() for lean in leans if lean is not None) if loop is not None]
    for loop in loops:
        loop.time_parts(True)
    try:
        yield
    finally:
        for loop in loops:
            kernel, matmuls, attention, _total = loop.part_seconds()
            seconds["kernel"] += kernel
            seconds["linear"] += matmuls
            seconds["lean attention"] += attention
            loop.time_parts(False)


def split_forward(modules: list[nn.Module], run, reset, repeats: int) -> dict[str, float]:
    """Median ms of `run()` (then `reset()`, untimed) in total and split by part.

    The total comes from runs without hooks; the split from as many hooked runs, scaled onto it.
    """
    totals = [_seconds(run, reset) for _ in range(repeats)]
    timer, parts = PartTimer(modules), []
    try:
        for _ in range(repeats):
            timer.seconds.clear()
            with timed_calls(timer), compiled_parts(modules, timer.seconds):
                total = _seconds(run, reset)
            parts.append(_parts(timer.seconds, total))
    finally:
        timer.remove()
    scale = statistics.median(totals) / statistics.median(p["total"] for p in parts)
    split = {part: statistics.median(p[part] for p in parts) * scale * 1e3 for part in PARTS}
    return split | {"total": statistics.median(totals) * 1e3}


def _parts(seconds: dict[str, float], total: float) -> dict[str, float]:
    linear = seconds.get("linear", 0.0)
    attention = seconds.get("attention", 0.0) - seconds.get("projections", 0.0) + seconds.get("lean attention", 0.0)
    return {"matmuls": linear, "kernel": seconds.get("kernel", 0.0),
            "attention": attention, "other": total - linear - attention, "total": total}


def _seconds(run, reset) -> float:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    reset()
    return seconds


@torch.inference_mode()
def forward_rows(pair, context: list[int], gamma: int, vocab_limit: int, repeats: int) -> dict[str, dict]:
    """The split of a target decode step, a target verification of gamma+1 rows and a drafter step."""
    rows = {}
    target, cache = pair.target, model_io.new_cache(pair.target)
    model_io.forward(target, cache, context, keep=1)
    length = len(context)
    for fed in (1, gamma + 1):
        ids = _ids_like(target, context[:fed])
        rows[f"target · {fed} token{'s' * (fed > 1)}"] = split_forward(
            [target], lambda: model_io.forward_tensor(target, cache, ids, keep=fed),
            lambda: model_io.crop_to(cache, length), repeats)
    if pair.drafter is not None:
        rows["drafter · 1 token"] = _drafter_row(pair, context, vocab_limit, repeats)
    return rows


def _drafter_row(pair, context: list[int], vocab_limit: int, repeats: int) -> dict[str, float]:
    drafter, cache = pair.drafter, model_io.new_cache(pair.drafter)
    model_io.forward(drafter, cache, context, keep=1)
    ids, length = _ids_like(drafter, context[:1]), len(context)
    if vocab_limit and vocab_limit < pair.vocab_size:  # the restricted head, as the chat drafts
        vocab = DraftVocab(drafter.get_output_embeddings(), vocab_limit, pair.eos_ids)
        vocab.update(context)
        vocab.logits(model_io.hidden_tensor(drafter, cache, ids))  # builds its rows before timing
        model_io.crop_to(cache, length)
        modules = [drafter, *vocab.layers]
        run = lambda: vocab.logits(model_io.hidden_tensor(drafter, cache, ids))  # noqa: E731
    else:
        modules, run = [drafter], lambda: model_io.forward_tensor(drafter, cache, ids, keep=1)  # noqa: E731
    return split_forward(modules, run, lambda: model_io.crop_to(cache, length), repeats)


def _ids_like(model, ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=model_io.input_device(model))


def host_rows(pair, gamma: int, draft_width: int, repeats: int) -> dict[str, float]:
    """Median ms of the host-side work of one step on random logits (the target's width; the
    drafter samples over its own, restricted width)."""
    width, generator = pair.vocab_size, make_generator(0)
    logits = torch.randn(gamma + 1, width, generator=generator) * 4
    drafts = logits[:gamma].argmax(-1)
    q = probs_from_logits(torch.randn(gamma, width, generator=generator) * 4, SAMPLED)
    row = logits[:1, :draft_width]
    jobs = {
        "verify, greedy": lambda: verify_greedy(drafts, logits),
        "verify, sampled (p from logits + rule)": lambda: verify_sampled(
            drafts, q, probs_from_logits(logits, SAMPLED), generator),
        "drafter sampling of 1 token": lambda: pick(row, SAMPLED, generator),
    }
    return {name: statistics.median(_seconds(job, lambda: None) for _ in range(repeats)) * 1e3
            for name, job in jobs.items()}


def forward_table(rows: dict[str, dict]) -> str:
    lines = ["| forward | total ms | matmuls | (of which the kernel) | attention | other |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['total']:.1f} | {r['matmuls']:.1f} | {r['kernel']:.1f} | "
                     f"{r['attention']:.1f} | {r['other']:.1f} |")
    return "\n".join(lines)


def host_table(rows: dict[str, float]) -> str:
    lines = ["| host-side, per step | ms |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {ms:.2f} |" for name, ms in rows.items()])


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--gamma", type=int, default=4, help="draft length of the verification forward (default 4)")
    parser.add_argument("--context", type=int, default=256, help="tokens already in the caches (default 256)")
    parser.add_argument("--repeats", type=int, default=9, help="runs per median (default 9)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.gamma < 1 or args.context < args.gamma + 1 or args.repeats < 1:
        print("specchat bench profile: error: --gamma ≥ 1, --context > gamma and --repeats ≥ 1", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        from specchat.loading.models import load_pair
        pair = load_pair(cfg, lambda message, _fraction: print(message, file=sys.stderr, flush=True))
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench profile: error: {err}", file=sys.stderr)
        return 2
    from specchat.bench.targets import fixed_text
    context = pair.tokenizer.encode(fixed_text())[:args.context]
    vocab_limit = cfg.speculation.drafter_vocab
    print(f"target {pair.target_facts.name} ({pair.target_facts.quantization}, {pair.target_facts.dtype}); "
          f"drafter {pair.drafter_facts.name if pair.drafter_facts else '—'}; {len(context)}-token context; "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}\n")
    print(forward_table(forward_rows(pair, context, args.gamma, vocab_limit, args.repeats)) + "\n")
    width = vocab_limit if 0 < vocab_limit < pair.vocab_size else pair.vocab_size
    print(host_table(host_rows(pair, args.gamma, width, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
