"""Side-by-side benchmark: specchat vs transformers generate() and assisted generation, one process.

    python -m specchat.bench [--config FILE] [--prompts FILE] [--quick] [--max-new N] [key=value ...]

Every method runs on the same loaded models, interleaved prompt by prompt after a warm-up, greedy
and sampled (T=0.7, top-p 0.9). Ratios are medians of per-prompt ratios measured in the same run.
Greedy runs also check that each method produced exactly the target-only tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specchat.bench.methods import ASSISTED, LLAMACPP_TARGET_ONLY, Measurement, Method, Runner, default_methods
from specchat.bench.turns import compare_reuse
from specchat.config import QUANTIZATIONS, ConfigError, Mode, SamplingConfig
from specchat.errors import ModelLoadError
from specchat.settings import load_config, with_value

PROMPTS_FILE = Path(__file__).parent.parent / "prompts" / "bench.json"
RESULTS_DIR = Path("bench") / "results"
SETTINGS = {
    "greedy": SamplingConfig(temperature=0.0),
    "sampled": SamplingConfig(temperature=0.7, top_p=0.9),
}


@dataclass
class Row:
    setting: str
    method: Method
    measurements: list[Measurement] = field(default_factory=list)
    vs_target: list[float] = field(default_factory=list)
    vs_hf: list[float] = field(default_factory=list)  # vs the best HF assisted, same drafter
    vs_hf_unquantized: list[float] = field(default_factory=list)  # vs the best on the unquantized drafter
    vs_llamacpp: list[float] = field(default_factory=list)  # vs llama.cpp target-only, same GGUF
    kinds: list[str] = field(default_factory=list)  # each prompt's kind (code, chat, ...)
    mismatches: list[str] = field(default_factory=list)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m specchat.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--prompts", help=f"prompt set JSON (default: {PROMPTS_FILE.name} in the package)")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 64 tokens: a few minutes")
    parser.add_argument("--only", default="", metavar="NAMES", help="only these prompts, by name (comma-separated)")
    parser.add_argument("--max-new", type=int, default=None, help="new tokens per reply (default 128, quick 64)")
    parser.add_argument("--settings", default="greedy,sampled", help="greedy,sampled or one of them")
    parser.add_argument("--no-turns", action="store_true", help="skip the multi-turn time-to-first-token check")
    parser.add_argument(
        "--other-targets",
        default="",
        metavar="QUANTIZATIONS",
        help="also run specchat on the target quantized these ways, e.g. w8a8 or none",
    )
    parser.add_argument(
        "--no-llamacpp",
        action="store_true",
        help="leave out llama.cpp's rows (they run when llama-cpp-python is installed)",
    )
    parser.add_argument(
        "--drafters",
        default="lookup,self:7",
        metavar="NAMES",
        help='drafters beyond the model with a row each at γ4 (auto: γauto): lookup, auto, head, self:N ("" for none)',
    )
    parser.add_argument(
        "--methods",
        default="",
        metavar="WORDS",
        help="only rows whose name contains one of these (comma-separated); baselines always run",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR), help="directory for the JSON and PNG results")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def load_prompts(path: str | None, quick: bool, only: str = "") -> list[dict]:
    prompts = json.loads(Path(path or PROMPTS_FILE).read_text())
    names = [name.strip() for name in only.split(",") if name.strip()]
    if names:
        unknown = sorted(set(names) - {p["name"] for p in prompts})
        if unknown:
            raise ConfigError(
                f"--only names no prompt called {', '.join(unknown)} "
                f"(there are {', '.join(p['name'] for p in prompts)})"
            )
        prompts = [p for p in prompts if p["name"] in names]
    if quick:
        code = [p for p in prompts if p["kind"] == "code"][:1]
        other = [p for p in prompts if p["kind"] != "code"][:1]
        prompts = code + other
    return prompts


def run_bench(runner: Runner, prompts: list[dict], settings: list[str], max_new: int, progress) -> list[Row]:
    rows = {(s, m.name): Row(s, m) for s in settings for m in runner.methods}
    runner.warm_up(prompts[0], max_new=8)
    for setting in settings:
        sampling = dataclasses.replace(SETTINGS[setting], max_new_tokens=max_new)
        for prompt in prompts:
            results = {}
            for method in runner.methods:
                results[method.name] = runner.measure(method, prompt, sampling)
                progress(f"{setting} · {prompt['name']} · {method.name}")
            _add_prompt_results(rows, setting, prompt, results, sampling.is_greedy)
    return list(rows.values())


def _best_hf(rows, setting, results: dict[str, Measurement], drafter: str) -> Measurement | None:
    assisted = [
        m
        for name, m in results.items()
        if rows[(setting, name)].method.mode == ASSISTED and rows[(setting, name)].method.drafter == drafter
    ]
    return max(assisted, key=lambda m: m.tokens_per_s, default=None)


def _add_prompt_results(rows, setting, prompt: dict, results: dict[str, Measurement], greedy: bool) -> None:
    """Ratios and exactness of every method, each against target-only on its own target."""
    hf_same = _best_hf(rows, setting, results, "loaded")
    hf_unquantized = _best_hf(rows, setting, results, "unquantized")
    llamacpp = results.get(LLAMACPP_TARGET_ONLY)
    for name, m in results.items():
        row = rows[(setting, name)]
        base = results[row.method.baseline]
        row.measurements.append(m)
        row.kinds.append(prompt["kind"])
        row.vs_target.append(m.tokens_per_s / base.tokens_per_s)
        row.vs_hf.append(m.tokens_per_s / hf_same.tokens_per_s if hf_same else None)
        row.vs_hf_unquantized.append(m.tokens_per_s / hf_unquantized.tokens_per_s if hf_unquantized else None)
        row.vs_llamacpp.append(m.tokens_per_s / llamacpp.tokens_per_s if llamacpp else None)
        if greedy and m.ids != base.ids:
            row.mismatches.append(prompt["name"])


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summed(parts: list) -> list | None:
    """Element-wise sums of equal-length tuples (None where there are none, or where one is None)."""
    if not parts or any(part is None for part in parts):
        return None
    return [sum(values) for values in zip(*parts)]


def ratios_of_kind(row: Row, kind: str) -> list[float]:
    """The row's per-prompt ratios over its own target-only, on the prompts of one kind."""
    return [v for v, prompt_kind in zip(row.vs_target, row.kinds) if prompt_kind == kind]


def summarise(row: Row) -> dict:
    ms = row.measurements
    speculative = row.method.kind == "specchat" and row.method.mode == Mode.SPEC
    summary = {
        "setting": row.setting,
        "method": row.method.name,
        "gamma": row.method.gamma_label,
        "tok_s": median([m.tokens_per_s for m in ms]),
        "vs_target": median(row.vs_target),
        "vs_hf_assisted": median(row.vs_hf),
        "vs_target_code": median(ratios_of_kind(row, "code")),
        "vs_target_edit": median(ratios_of_kind(row, "edit")),  # a pasted file and a change: lookup's case
        "worst_vs_target": min(row.vs_target, default=None),
        "vs_hf_unquantized": median(row.vs_hf_unquantized),
        "vs_llamacpp": median(row.vs_llamacpp),
        "alpha": median([m.alpha for m in ms]),
        "tokens_per_step": median([m.tokens_per_step for m in ms]),
        "c": median([m.cost_ratio for m in ms]),
        "mean_gamma": median([m.mean_gamma for m in ms]),
        "predicted": median([m.predicted for m in ms]) if speculative else None,
        "exact": (not row.mismatches) if row.setting == "greedy" else None,
        "mismatched_prompts": row.mismatches,
        "tokens": [m.new_tokens for m in ms],
        "steps_edit": summed([m.steps for m, kind in zip(ms, row.kinds) if kind == "edit"]),
        "split_s_edit": summed([m.split_s for m, kind in zip(ms, row.kinds) if kind == "edit"]),
    }
    if summary["predicted"] and summary["vs_target"]:
        summary["of_predicted"] = summary["vs_target"] / summary["predicted"]
    return summary


def write_results(summaries: list[dict], meta: dict, out_dir: Path) -> tuple[Path, Path | None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps({"meta": meta, "rows": summaries}, indent=2) + "\n")
    from specchat.bench.report import plot_speedups

    png_path = plot_speedups(summaries, out_dir / "speedup.png")
    return json_path, png_path


def _llamacpp_available(cfg, console) -> bool:
    from specchat.bench.llamacpp import unavailable

    try:
        reason = unavailable(cfg)
    except ModelLoadError as err:
        reason = f"llama.cpp rows skipped: {err}"
    if reason:
        console.print(reason)
    return not reason


def _fail(message: str) -> int:
    print(f"specchat bench: error: {message}", file=sys.stderr)
    return 2


def chosen_methods(methods: list[Method], words: str) -> list[Method]:
    """The methods whose name contains one of the comma-separated words, with the baselines they are
    compared with; all of them when there are no words."""
    wanted = [w.strip() for w in words.split(",") if w.strip()]
    if not wanted:
        return methods
    kept = {m.name for m in methods if any(w in m.name for w in wanted)}
    kept |= {m.baseline for m in methods if m.name in kept}
    return [m for m in methods if m.name in kept]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from rich.console import Console

    from specchat.bench.report import results_table, turns_table, with_progress

    console = Console(stderr=False)
    try:
        cfg = load_config(args.config, args.overrides)
        prompts = load_prompts(args.prompts, args.quick, args.only)
    except (ConfigError, OSError, json.JSONDecodeError) as err:
        return _fail(str(err))
    max_new = args.max_new or (64 if args.quick else 128)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or any(s not in SETTINGS for s in settings):
        return _fail(f"--settings must name greedy and/or sampled, got '{args.settings}'")
    other_targets = tuple(q.strip() for q in args.other_targets.split(",") if q.strip())
    if any(q not in QUANTIZATIONS or q == cfg.target.quantization for q in other_targets):
        return _fail(
            f"--other-targets takes quantizations other than the configured target's "
            f"({', '.join(QUANTIZATIONS)}), got '{args.other_targets}'"
        )
    try:
        drafters = tuple(
            with_value(cfg, "speculation.drafter", d.strip()).speculation.drafter
            for d in args.drafters.split(",")
            if d.strip()
        )
    except ConfigError as err:
        return _fail(f"--drafters: {err}")
    llamacpp = not args.no_llamacpp and _llamacpp_available(cfg, console)
    methods = chosen_methods(default_methods(cfg, other_targets, llamacpp, drafters), args.methods)
    try:
        runner = Runner.load(cfg, methods, console)
    except ModelLoadError as err:
        return _fail(str(err))
    problems = [runner.engine.drafter_problem(d) for d in drafters]
    if any(problems):
        return _fail(f"--drafters: {next(p for p in problems if p)}")
    started = time.time()
    total = len(settings) * len(prompts) * len(runner.methods)
    rows = with_progress(console, total, lambda tick: run_bench(runner, prompts, settings, max_new, tick))
    summaries = [summarise(r) for r in rows]
    turns = [] if args.no_turns else compare_reuse(runner.pair, cfg)
    meta = runner.meta() | {
        "prompts": [p["name"] for p in prompts],
        "max_new_tokens": max_new,
        "seconds": round(time.time() - started, 1),
        "command": "python -m specchat.bench " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    meta["multi_turn"] = [t.__dict__ for t in turns]
    console.print(results_table(summaries, meta))
    if turns:
        console.print(turns_table(turns))
    json_path, png_path = write_results(summaries, meta, Path(args.out))
    console.print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
