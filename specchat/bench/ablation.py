"""Each speed lever changed alone, measured side by side with the default levers, on the bundled pair.

    .venv/bin/python -m specchat.bench.ablation [--max-new N] [--settings greedy,sampled] [--prompts a,b]
                                       [--variants lookup,drafter,gamma] [--repeat N]

Variants (specchat only): the config's levers as they are, with auto gamma ("default levers");
prompt lookup switched the other way (on, since it is off by default); the drafter unquantized (as
shipped); a fixed gamma 4 instead of auto. Every variant runs on every prompt in turn after a warm-up; ratios are
medians of per-prompt ratios against target-only in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from rich.console import Console
from rich.table import Table

from specchat.bench.methods import Method, Runner
from specchat.bench.suite import SETTINGS, load_prompts
from specchat.config import AUTO, Mode, SpeculationConfig
from specchat.loading.models import load_model, load_pair
from specchat.settings import load_config

TARGET = Method("target-only", "specchat", Mode.TARGET)
BASELINE = "default levers (auto γ)"


def lookup_switched(spec: SpeculationConfig) -> tuple[str, SpeculationConfig]:
    """Prompt lookup the other way from the config: (the variant's label, its speculation settings)."""
    label = "no prompt lookup" if spec.prompt_lookup else "+ prompt lookup"
    return label, dataclasses.replace(spec, prompt_lookup=not spec.prompt_lookup)


def variants(cfg, pair, unquantized, wanted: list[str]) -> dict[str, Runner]:
    spec, system = cfg.speculation, cfg.ui.system_prompt
    auto, fixed = Method("auto", "specchat", Mode.SPEC, AUTO), Method("γ4", "specchat", Mode.SPEC, 4)
    runners = {BASELINE: Runner(pair, [TARGET, auto], system, spec)}
    if "lookup" in wanted:
        label, switched = lookup_switched(spec)
        runners[label] = Runner(pair, [auto], system, switched)
    if "drafter" in wanted:
        runners["unquantized drafter"] = Runner(dataclasses.replace(pair, drafter=unquantized()), [auto], system, spec)
    if "gamma" in wanted:
        runners["fixed γ4"] = Runner(pair, [fixed], system, spec)
    return runners


def measure(runners: dict[str, Runner], prompts, sampling) -> dict[str, list]:
    rows = {name: [] for name in runners}
    for prompt in prompts:
        results = {name: [r.measure(m, prompt, sampling) for m in r.methods] for name, r in runners.items()}
        base = results[BASELINE][0]
        for name, measured in results.items():
            m = measured[-1]
            rows[name].append((m.tokens_per_s / base.tokens_per_s, m.tokens_per_s, m.alpha, m.cost_ratio))
        print(
            f"  {prompt['name']}: target-only {base.tokens_per_s:.2f} tok/s · "
            + " · ".join(f"{name} {values[-1][0]:.2f}×" for name, values in rows.items()),
            flush=True,
        )
    return rows


def table(setting: str, rows: dict[str, list]) -> Table:
    out = Table(title=f"{setting}: each lever changed alone (medians over prompts)")
    for column in ("variant", "× target-only", "tok/s", "acceptance", "c"):
        out.add_column(column, justify="left" if column == "variant" else "right")
    for name, values in rows.items():
        ratio, tok_s, acceptance, c = (statistics.median(v[i] for v in values) for i in range(4))
        out.add_row(name, f"{ratio:.2f}×", f"{tok_s:.2f}", f"{acceptance:.0%}", f"{c:.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--settings", default="greedy")
    parser.add_argument("--prompts", default="", help="comma-separated prompt names (default: all)")
    parser.add_argument("--variants", default="lookup,drafter,gamma", help="levers to change, one at a time")
    parser.add_argument("--repeat", type=int, default=1, help="run the prompt set this many times")
    args = parser.parse_args()
    cfg = load_config(None, [])
    pair = load_pair(cfg)

    def unquantized():
        return load_model(dataclasses.replace(cfg.drafter, quantization="none"), role="drafter")[0]

    prompts = [p for p in load_prompts(None, False) if not args.prompts or p["name"] in args.prompts.split(",")]
    prompts = prompts * args.repeat
    runners = variants(cfg, pair, unquantized, args.variants.split(","))
    for runner in runners.values():
        runner.warm_up(prompts[0], max_new=8)
    console = Console(width=120)
    for setting in args.settings.split(","):
        sampling = dataclasses.replace(SETTINGS[setting], max_new_tokens=args.max_new)
        console.print(table(setting, measure(runners, prompts, sampling)))


if __name__ == "__main__":
    main()
