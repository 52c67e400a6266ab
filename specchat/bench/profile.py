"""Where a step's time goes: matmuls, attention, everything else, and the host-side verification.

    python -m specchat.bench.profile [--config FILE] [--gamma 4] [--context 256] [--repeats 9] [key=value ...]
    python -m specchat.bench.profile --prefill 512 2048 8192 [--chunk N]   (prompt reading: bench/prefill.py)
    python -m specchat.bench.profile --rows 1 5 9 17 33 65   (T(n): a target forward of n rows, what a copy costs)
    python -m specchat.bench.profile --steps [--tokens 128]   (a whole step of a real reply, by part: step_split.py)
    python -m specchat.bench.profile --layer-types Q4_K Q4_0 Q8_0 [--shape 7b] [--rows 1 5 9]
        (the kernel alone over a layer of that shape in each GGUF type, no model loaded: layer_types.py)

For one decode step of the target (1 token), a verification forward of the target (gamma+1 tokens)
and one decode step of the drafter (1 token, with the drafter's restricted head as the chat runs it),
it prints the median time split by what ran, measured by timing hooks on the modules:
- matmuls: every linear layer (the head too), whatever its kind; for w8a8 and w4a8 layers, the
  kernel calls alone (fbgemm's int8 product, specchat's 4-bit one) are shown apart as "kernel";
- attention: the attention modules minus their projections (scores, softmax, rotary, cache writes);
  with the lean forward, which calls no attention module, the attention function alone (timed
  inside the compiled layer loop where w4a8 layers run in one C++ call);
- other: the rest of the forward (Python and dispatch, norms, embeddings, masks, cache bookkeeping).
Then the host-side work per step on both models' logits at the context's end: greedy verification, and
sampled verification (probabilities from logits at T=0.7/top-p 0.9, the rejection rule) and the drafter's
sampling of one token.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from specchat.bench.layer_types import SHAPES, TYPES, type_rows, types_table, unknown_types
from specchat.bench.part_timing import seconds_of, split_forward
from specchat.bench.prefill import prefill_rows, prefill_table, prompt_ids
from specchat.config import ConfigError, SamplingConfig
from specchat.errors import ModelLoadError
from specchat.kernels.build import running_path
from specchat.progress import to_stderr
from specchat.settings import load_config
from specchat.speculative import model_io
from specchat.speculative.drafters.vocab import DraftVocab
from specchat.speculative.model_io import PREFILL_CHUNK
from specchat.speculative.sampling import make_generator
from specchat.speculative.verify import verify_greedy, verify_sampled

SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9)


@torch.inference_mode()
def forward_rows(pair, context: list[int], gamma: int, vocab_limit: int, repeats: int) -> dict[str, dict]:
    """The split of a target decode step, a target verification of gamma+1 rows and a drafter step."""
    rows = {}
    target, cache = pair.target, model_io.new_kv_cache(pair.target)
    model_io.forward(target, cache, context, keep=1)
    length = len(context)
    for fed in (1, gamma + 1):
        ids = _ids_like(target, context[:fed])
        rows[f"target · {fed} token{'s' * (fed > 1)}"] = split_forward(
            [target],
            lambda ids=ids, fed=fed: model_io.forward_tensor(target, cache, ids, keep=fed),
            lambda: model_io.crop_to(cache, length),
            repeats,
        )
    if pair.drafter is not None:
        rows["drafter · 1 token"] = _drafter_row(pair, context, vocab_limit, repeats)
    return rows


def _drafter_row(pair, context: list[int], vocab_limit: int, repeats: int) -> dict[str, float]:
    drafter, cache = pair.drafter, model_io.new_kv_cache(pair.drafter)
    model_io.forward(drafter, cache, context, keep=1)
    ids, length = _ids_like(drafter, context[:1]), len(context)
    if vocab_limit and vocab_limit < pair.vocab_size:  # the restricted head, as the chat drafts
        vocab = DraftVocab(drafter.get_output_embeddings(), vocab_limit, pair.eos_ids)
        vocab.update(context)
        vocab.logits(model_io.hidden_tensor(drafter, cache, ids))  # builds its rows before timing
        model_io.crop_to(cache, length)
        modules = [drafter, *vocab.layers]
        run = lambda: vocab.logits(model_io.hidden_tensor(drafter, cache, ids))
    else:
        modules, run = [drafter], lambda: model_io.forward_tensor(drafter, cache, ids, keep=1)
    return split_forward(modules, run, lambda: model_io.crop_to(cache, length), repeats)


def _ids_like(model, ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=model_io.input_device(model))


def host_rows(
    pair, gamma: int, draft_width: int, repeats: int, logits: tuple[torch.Tensor, torch.Tensor] | None = None
) -> dict[str, float]:
    """Median ms of the host-side work of one step (the target's width; the drafter samples over its own,
    restricted width) on `logits`: the target's [gamma+1, vocab] and the drafter's [gamma, vocab], as
    real_logits gives them (a real reply's nucleus is narrow, and top-p's cost follows it), else random ones."""
    width, generator = pair.vocab_size, make_generator(0)
    target, drafter = logits or (
        torch.randn(gamma + 1, width, generator=generator) * 4,
        torch.randn(gamma, width, generator=generator) * 4,
    )
    target, drafter = target[:, :width].float(), drafter[:, :width].float()
    drafts = drafter.argmax(-1)
    sampler = pair.sampler  # what the chat computes p and q with (the compiled code where a w4a8 model runs)
    q = sampler.probs(drafter, SAMPLED)
    row = drafter[-1:, :draft_width]
    jobs = {
        "verify, greedy (argmax and each row's log-sum-exp)": lambda: greedy_verdict(drafts, target, sampler),
        "verify, sampled (p from logits + rule)": lambda: verify_sampled(
            drafts, q, sampler.probs(target, SAMPLED), generator
        ),
        "drafter sampling of 1 token": lambda: sampler.pick(row, SAMPLED, generator),
    }
    return {
        name: statistics.median(seconds_of(job, lambda: None) for _ in range(repeats)) * 1e3
        for name, job in jobs.items()
    }


def greedy_verdict(drafts: torch.Tensor, target: torch.Tensor, sampler) -> None:
    """What a greedy step computes on the host (step.py): the rows' argmax and log-sum-exp (the sampler's greedy rows:
    the compiled module's where the pair runs on it), then the verdict."""
    choice, _ = sampler.greedy(target)
    verify_greedy(drafts, target, choice)


def real_logits(pair, context: list[int], gamma: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The target's logits at the context's last gamma+1 positions and the drafter's at its last gamma
    (None without a drafter)."""
    if pair.drafter is None:
        return None
    return (
        model_io.forward(pair.target, model_io.new_kv_cache(pair.target), context, keep=gamma + 1),
        model_io.forward(pair.drafter, model_io.new_kv_cache(pair.drafter), context, keep=gamma),
    )


def forward_table(rows: dict[str, dict]) -> str:
    lines = [
        "| forward | total ms | matmuls | (of which the kernel) | attention | other |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['total']:.1f} | {r['matmuls']:.1f} | {r['kernel']:.1f} | "
            f"{r['attention']:.1f} | {r['other']:.1f} |"
        )
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
    parser.add_argument(
        "--prefill",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: how fast each model reads a prompt of N tokens, and the split",
    )
    parser.add_argument(
        "--rows",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: the target's forward of N rows after the context, T(N) and T(N)/T(1) (verifying N-1 drafts)",
    )
    parser.add_argument(
        "--steps",
        action="store_true",
        help="instead: a real reply's steps (drafter model, --gamma), each split by part (bench/step_split.py)",
    )
    parser.add_argument("--tokens", type=int, default=128, help="with --steps: tokens of the timed reply (128)")
    parser.add_argument(
        "--chunk",
        type=int,
        default=PREFILL_CHUNK,
        help=f"with --prefill: prompt tokens a forward (default {PREFILL_CHUNK}, as the chat reads)",
    )
    parser.add_argument(
        "--layer-types",
        nargs="+",
        metavar="TYPE",
        help=f"instead: the kernel over one layer of --shape in each GGUF type ({', '.join(TYPES)}), T(n) for --rows",
    )
    parser.add_argument(
        "--shape", default="7b", choices=list(SHAPES), help="with --layer-types: the layer's shape (default 7b)"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if (
        args.gamma < 1
        or args.context < args.gamma + 1
        or args.repeats < 1
        or args.chunk < 1
        or min(args.prefill or [1]) < 1
        or min(args.rows or [1]) < 1
    ):
        print(
            "specchat bench profile: error: --gamma ≥ 1, --context > gamma, --repeats, --chunk, --prefill, --rows ≥ 1",
            file=sys.stderr,
        )
        return 2
    if args.layer_types:
        return _layer_types_report(args.layer_types, args.shape, args.rows or [1, 5, 9], args.repeats)
    try:
        cfg = load_config(args.config, args.overrides)
        from specchat.loading.models import load_pair

        pair = load_pair(cfg, to_stderr())
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench profile: error: {err}", file=sys.stderr)
        return 2
    from specchat.bench.targets import fixed_text

    if args.prefill:
        return _prefill_report(pair, fixed_text(), args.prefill, args.chunk)
    context = pair.tokenizer.encode(fixed_text())[: args.context]
    if args.rows:
        return _rows_report(pair, context, args.rows, args.repeats)
    if args.steps:
        return _steps_report(pair, cfg, args.gamma, args.tokens)
    vocab_limit = cfg.speculation.drafter_vocab
    print(
        f"target {pair.target_facts.name} ({pair.target_facts.quantization}, {pair.target_facts.dtype}); "
        f"drafter {pair.drafter_facts.name if pair.drafter_facts else '—'}; {len(context)}-token context; "
        f"{torch.get_num_threads()} threads; medians of {args.repeats}\n"
    )
    print(forward_table(forward_rows(pair, context, args.gamma, vocab_limit, args.repeats)) + "\n")
    width = vocab_limit if 0 < vocab_limit < pair.vocab_size else pair.vocab_size
    print(host_table(host_rows(pair, args.gamma, width, args.repeats, real_logits(pair, context, args.gamma))))
    return 0


def _layer_types_report(kinds: list[str], shape: str, rows: list[int], repeats: int) -> int:
    unknown = unknown_types(kinds)
    if unknown:
        print(
            f"specchat bench profile: error: --layer-types: no kernel type {', '.join(unknown)} "
            f"(known: {', '.join(TYPES)})",
            file=sys.stderr,
        )
        return 2
    from specchat.kernels.build import q4_kernel

    try:
        kernel = q4_kernel(to_stderr())
    except ModelLoadError as err:
        print(f"specchat bench profile: error: {err}", file=sys.stderr)
        return 2
    print(
        f"one {shape}-shape layer (q, k, v, o, gate, up, down) per type; kernel path {running_path()}; "
        f"{torch.get_num_threads()} threads; medians of {repeats}\n"
    )
    print(types_table(type_rows(kernel.q4_linear, kinds, SHAPES[shape], rows, repeats), rows))
    return 0


@torch.inference_mode()
def row_costs(pair, context: list[int], rows: list[int], repeats: int) -> dict[int, float]:
    """Median ms of a target forward of n rows after `context`, per n: T(n), what verifying n-1 drafts costs."""
    target, cache = pair.target, model_io.new_kv_cache(pair.target)
    model_io.forward(target, cache, context, keep=1)
    length = len(context)
    return {n: _forward_ms(target, cache, (context * (n // length + 1))[:n], length, repeats) for n in rows}


def _forward_ms(target, cache, ids: list[int], length: int, repeats: int) -> float:
    fed = _ids_like(target, ids)
    run = lambda: model_io.forward_tensor(target, cache, fed, keep=len(ids))
    return statistics.median(seconds_of(run, lambda: model_io.crop_to(cache, length)) for _ in range(repeats)) * 1e3


def _rows_report(pair, context: list[int], rows: list[int], repeats: int) -> int:
    costs = row_costs(pair, context, sorted(set([1, *rows])), repeats)
    print(
        f"target {pair.target_facts.name} ({pair.target_facts.quantization}); kernel {running_path() or '—'}; "
        f"{len(context)}-token context; {torch.get_num_threads()} threads; medians of {repeats}\n"
    )
    lines = ["| rows n | T(n) ms | T(n)/T(1) | per extra row, × T(1) |", "|---|---|---|---|"]
    for n, ms in costs.items():
        extra = f"{(ms / costs[1] - 1) / (n - 1):.3f}" if n > 1 else "—"
        lines.append(f"| {n} | {ms:.1f} | {ms / costs[1]:.2f} | {extra} |")
    print("\n".join(lines))
    return 0


def _steps_report(pair, cfg, gamma: int, tokens: int) -> int:
    from specchat.bench.step_split import report
    from specchat.bench.suite import load_prompts
    from specchat.session.chat import render_prompt

    prompt = load_prompts(None, quick=True)[0]
    ids = render_prompt(pair.tokenizer, cfg.ui.system_prompt, prompt["messages"])
    print(
        f"target {pair.target_facts.name} ({pair.target_facts.quantization}); drafter "
        f"{pair.drafter_facts.name if pair.drafter_facts else '—'}; kernel {running_path() or '—'}; γ {gamma}; "
        f"drafter_vocab {cfg.speculation.drafter_vocab}; {torch.get_num_threads()} threads; prompt {prompt['name']!r}, greedy, {tokens} tokens\n"
    )
    print(report(pair, list(ids), gamma, tokens, cfg.speculation))
    return 0


def _prefill_report(pair, text: str, lengths: list[int], chunk: int) -> int:
    ids = prompt_ids(pair.tokenizer, text, max(lengths))
    print(
        f"target {pair.target_facts.name} ({pair.target_facts.quantization}); drafter "
        f"{pair.drafter_facts.name if pair.drafter_facts else '—'}; kernel {running_path() or '—'}; "
        f"{torch.get_num_threads()} threads; one run each\n"
    )
    print(prefill_table(prefill_rows(pair, ids, lengths, chunk), chunk))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
