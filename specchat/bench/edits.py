"""Edit replies, side by side: a pasted file and one change asked, target-only against the default speculative
decoding, interleaved prompt by prompt on the same loaded pair, greedy (each pair of replies checked equal).

    python -m specchat.bench.edits [--max-new 512] [--slow-drafter SECONDS] [--rounds N] [key=value ...]

Per reply it prints the ratio, the split of the target's steps (copied, model-drafted, target-only) and of the
reply's time (reading the prompt, copies, model drafts, target-only), and the held-back count: target-only steps
taken while a copy from the conversation was there to be had (prompt lookup found a match). `--slow-drafter`
pads every drafter-model forward with a sleep, so that the drafter does not pay (c ≥ 1) and auto gamma turns it
off: what is left is the copies.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass

from specchat.config import AUTO, ConfigError, Mode, SamplingConfig
from specchat.errors import ModelLoadError
from specchat.settings import load_config
from specchat.speculative.drafters import model as model_drafter
from specchat.speculative.drafters.lookup import match_start
from specchat.speculative.events import ReplyEnd
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.metrics import ReplyStats
from specchat.speculative.step import StepResult


@dataclass
class Reply:
    stats: ReplyStats
    ids: tuple[int, ...]
    held_back: int = 0  # target-only steps taken where a copy matched
    longest_target_run: int = 0  # the longest run of target-only steps


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.edits", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--max-new", type=int, default=512, help="new tokens at most a reply (default 512)")
    parser.add_argument("--rounds", type=int, default=1, help="times through the edit prompts (default 1)")
    parser.add_argument(
        "--slow-drafter", type=float, default=0.0, metavar="SECONDS", help="sleep added to every drafter forward"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def slow_down_drafter(seconds: float) -> None:
    """Pad every drafter-model forward of this process with a sleep (inside the time the drafter is charged)."""
    forward = model_drafter.ModelDrafter._next_logits

    def padded(self, *args, **kwargs):
        time.sleep(seconds)
        return forward(self, *args, **kwargs)

    model_drafter.ModelDrafter._next_logits = padded  # type: ignore[method-assign]


def reply(engine, ids: list[int], speculation, max_new: int) -> Reply:
    """One greedy reply from a fresh cache and a fresh gamma policy, with its held-back count."""
    engine.reset()
    engine.use_policy(AutoGamma())
    seen, held_back, run, longest = list(ids), 0, 0, 0
    for item in engine.steps(ids, SamplingConfig(temperature=0.0, max_new_tokens=max_new), speculation):
        if isinstance(item, StepResult):
            target_only = not item.drafted
            held_back += 1 if target_only and match_start(seen) is not None else 0
            run = run + 1 if target_only else 0
            longest = max(longest, run)
            seen += item.tokens
        elif isinstance(item, ReplyEnd):
            return Reply(item.stats, item.ids, held_back, longest)
    raise RuntimeError("the reply ended without its ReplyEnd")


def reply_line(name: str, target: Reply, spec: Reply) -> str:
    t, s = target.stats, spec.stats
    return (
        f"{name}: {len(spec.ids)} tok · {s.tokens_per_s / t.tokens_per_s:.2f}× target-only "
        f"({s.tokens_per_s:.1f} / {t.tokens_per_s:.1f} tok/s; generation alone "
        f"{s.generation_tokens_per_s / t.generation_tokens_per_s:.2f}×) · {s.tokens_per_step:.1f} tok/step · "
        f"steps {s.copied_steps} copied, {s.model_steps} model, {s.target_only_steps} target-only "
        f"(longest target-only run {spec.longest_target_run}, {spec.held_back} with a copy to be had) · "
        f"time: reading {s.prefill_s:.2f} s (target-only {t.prefill_s:.2f}), copies {s.copy_s:.2f}, "
        f"model drafts {s.model_s:.2f}, target-only {s.target_only_s:.2f} · c {s.cost_ratio:.2f}"
    )


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.max_new < 1 or args.rounds < 1 or args.slow_drafter < 0:
        print("specchat bench edits: error: --max-new and --rounds ≥ 1, --slow-drafter ≥ 0", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        from rich.console import Console

        from specchat.bench.methods import Runner
        from specchat.bench.suite import load_prompts

        runner = Runner.load(cfg, [], Console(stderr=True))
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench edits: error: {err}", file=sys.stderr)
        return 2
    if args.slow_drafter:
        slow_down_drafter(args.slow_drafter)
    prompts = [p for p in load_prompts(None, False) if p["kind"] == "edit"]
    spec = dataclasses.replace(cfg.speculation, gamma=AUTO, mode=Mode.SPEC, drafter="auto")
    target_only = dataclasses.replace(cfg.speculation, gamma=0, mode=Mode.TARGET)
    reply(runner.engine, runner.prompt_ids(prompts[0]), spec, 16)  # warm-up
    ratios, mismatches = [], 0
    for _ in range(args.rounds):
        for prompt in prompts:
            ids = runner.prompt_ids(prompt)
            alone = reply(runner.engine, ids, target_only, args.max_new)
            fast = reply(runner.engine, ids, spec, args.max_new)
            mismatches += fast.ids != alone.ids
            ratios.append(fast.stats.tokens_per_s / alone.stats.tokens_per_s)
            print(reply_line(prompt["name"], alone, fast), flush=True)
    print(f"median {statistics.median(ratios):.2f}× target-only over {len(ratios)} replies; exact: {mismatches == 0}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
