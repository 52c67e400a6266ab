"""The drafter cut to fewer layers: which could go, and what the cut drafter then agrees on and costs.

    python -m specchat.bench.drafter_layers [--config FILE] [--drop 4] [--max-new-tokens 128] [key=value ...]

The configured target writes its greedy reply to each search prompt (SEARCH_PROMPTS, below) and to each bench
prompt. Then layers of the configured drafter are left out one round at a time: each round leaves out the layer
(never the first nor the last) whose absence keeps the drafter's greedy agreement with the target on the search
replies highest. The bench replies, held out of the search, say what the cut drafter agrees on (greedy agreement
and sampled acceptance, as `python -m specchat.bench.drafters` counts them), and T(1) what one forward of it costs
(its whole head, as that bench times it). No layer is trained: this measures what cutting alone gives.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator

from specchat.bench.drafters import Reply, Target, agreement, target_replies
from specchat.bench.suite import load_prompts
from specchat.bench.targets import fixed_text, forward_ms
from specchat.config import ConfigError, SamplingConfig
from specchat.errors import ModelLoadError
from specchat.progress import to_stderr
from specchat.session.chat import render_prompt
from specchat.settings import load_config
from specchat.speculative.drafters.self_layers import layer_count, layers_view

SEARCH_PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string without using datetime.fromisoformat.",
    "Implement a LRU cache class in Python with get and put in O(1).",
    "Write a bash script that finds the 10 largest files under a directory.",
    "Explain the difference between a process and a thread, with a short C example.",
    "Write a JavaScript debounce function and show how to use it with a search box.",
    "Refactor this code to use a dataclass:\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    "        self.y = y\n    def __repr__(self):\n        return 'Point(%r, %r)' % (self.x, self.y)\n",
    "Write a Rust function that reverses the words in a string.",
    "How do I read a CSV file with pandas and compute the mean of each column grouped by a key? Show code.",
]  # not the bench's prompts: those are held out of the search
SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9)


def leave_out(layers: int, rounds: int, score: Callable[[list[int]], float]) -> Iterator[tuple[int, list[int], float]]:
    """Greedy: each round, (the layer left out, the layers kept, their score), the layer being the one whose absence
    scores highest among those kept but the first and the last."""
    keep = list(range(layers))
    for _ in range(min(rounds, layers - 2)):
        scored = [(score([j for j in keep if j != i]), i) for i in keep[1:-1]]
        best, left_out = max(scored, key=lambda pair: (pair[0], -pair[1]))
        keep.remove(left_out)
        yield left_out, list(keep), best


def cut_rows(
    drafter, width: int, search: list[Reply], held_out: list[Reply], rounds: int, context: list[int], say
) -> list[dict]:
    """The whole drafter's row, then one row a round of leave_out: layers, search agreement, held-out greedy
    agreement and sampled acceptance, T(1)."""

    def row(keep: list[int], left_out: list[int], searched: float) -> dict:
        view = layers_view(drafter, keep)
        greedy, sampled = agreement(held_out, view, width, SAMPLED)
        result = {"left_out": left_out, "layers": len(keep), "search": searched, "greedy": greedy}
        result |= {"sampled": sampled, "t1_ms": forward_ms(view, context, 1)}
        say(_line(result))
        return result

    searched = lambda keep: agreement(search, layers_view(drafter, keep), width, SAMPLED)[0]
    total = layer_count(drafter)
    rows = [row(list(range(total)), [], searched(list(range(total))))]
    for left_out, keep, best in leave_out(total, rounds, searched):
        rows.append(row(keep, [*rows[-1]["left_out"], left_out], best))
    return rows


def _line(r: dict) -> str:
    without = f"without layers {', '.join(map(str, r['left_out']))}" if r["left_out"] else "every layer"
    return (
        f"{r['layers']:>3} layers ({without}) · search agreement {r['search']:.1%} · held out: greedy agreement "
        f"{r['greedy']:.1%}, sampled acceptance {r['sampled']:.1%} · T(1) {r['t1_ms']:.1f} ms"
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m specchat.bench.drafter_layers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--drop", type=int, default=4, help="rounds: layers left out, one a round (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="length of each target reply (default 128)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    say = lambda line: print(line, flush=True)
    progress = to_stderr()
    try:
        if args.drop < 1 or args.max_new_tokens < 1:
            raise ConfigError("--drop and --max-new-tokens must be 1 or more")
        cfg = load_config(args.config, args.overrides)
        if not cfg.drafter.source:
            raise ConfigError("this config has no drafter to cut")
        from specchat.loading.models import load_model

        target = Target(*load_model(cfg.target, progress, role="target", kv_cache=cfg.runtime.kv_cache))
        render = lambda messages: render_prompt(target.tokenizer, cfg.ui.system_prompt, messages)
        search = [render([{"role": "user", "content": text}]) for text in SEARCH_PROMPTS]
        held_out = [render(p["messages"]) for p in load_prompts(None, False, "")]
        search_replies = target_replies(target, search, args.max_new_tokens, SAMPLED, progress)
        held_replies = target_replies(target, held_out, args.max_new_tokens, SAMPLED, progress)
        drafter, _, facts = load_model(cfg.drafter, progress, role="drafter", kv_cache=cfg.runtime.kv_cache)
        say(
            f"drafter {facts.name} ({facts.quantization}) for target {target.facts.name}: greedy replies to "
            f"{len(search)} search prompts and {len(held_out)} held-out bench prompts"
        )
        context = target.tokenizer.encode(fixed_text())
        cut_rows(drafter, target.vocab_size, search_replies, held_replies, args.drop, context, say)
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench drafter_layers: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
