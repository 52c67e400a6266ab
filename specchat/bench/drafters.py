"""Drafter quantizations compared: how often each agrees with the target, and what its forward costs.

    python -m specchat.bench.drafters [--config FILE] [--modes auto-fast,w4a8,none] [--only NAMES]
                                      [--max-new-tokens 128] [--temperature 0.7] [--top-p 0.9] [key=value ...]

The configured target writes its greedy reply to each bench prompt; then the target and each quantization of
the configured drafter read prompt + reply, and at every reply position this counts
- greedy agreement: the drafter's most likely token is the target's (a greedy draft passes);
- sampled acceptance: Σ_x min(p(x), q(x)), both laws at --temperature / --top-p: the chance that a draft
  sampled from q passes the rejection rule (Leviathan et al.);
then times one drafter forward of 1 token after a 256-token context (T(1)). The drafter's whole head is
scored here, not speculation.drafter_vocab's subset. The target's laws at every reply position are kept while the
drafters load one after another (about 0.9 GB for the bundled pair's 12 prompts × 128 tokens). Progress goes to
stderr, the results to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from specchat.bench.suite import load_prompts
from specchat.bench.targets import fixed_text, forward_ms, quantization_modes
from specchat.config import ConfigError, SamplingConfig
from specchat.errors import ModelLoadError
from specchat.progress import to_stderr
from specchat.session.chat import render_prompt
from specchat.settings import load_config
from specchat.speculative.model_io import forward, new_kv_cache
from specchat.speculative.sampling import probs_from_logits


@dataclasses.dataclass
class Target:
    """The configured target, loaded alone."""

    model: object
    tokenizer: object
    facts: object

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


@dataclasses.dataclass
class Reply:
    """A prompt, the target's greedy reply to it, and the target's laws at each reply position."""

    prompt: list[int]
    reply: list[int]
    greedy: torch.Tensor  # [n] the target's most likely token at each position (the reply itself)
    p: torch.Tensor  # [n, vocab] the target's law at each position, sampled settings


@torch.inference_mode()
def reply_logits(model, prompt: list[int], reply: list[int], width: int) -> torch.Tensor:
    """[len(reply), width] float32 logits of `model` at the positions that predict each reply token."""
    return forward(model, new_kv_cache(model), prompt + reply[:-1], keep=len(reply))[:, :width].float()


def target_replies(
    target: Target, prompts: list[list[int]], max_new: int, sampling: SamplingConfig, progress=None
) -> list[Reply]:
    from specchat.api import autoregressive_generate

    replies = []
    for index, ids in enumerate(prompts):
        if progress:
            progress(f"the target's reply to prompt {index + 1} of {len(prompts)}")
        reply = autoregressive_generate(ids, target.model, target.tokenizer, max_new_tokens=max_new).ids
        logits = reply_logits(target.model, ids, reply, target.vocab_size)
        replies.append(Reply(ids, reply, logits.argmax(-1), probs_from_logits(logits, sampling)))
    return replies


def agreement(replies: list[Reply], drafter, width: int, sampling: SamplingConfig) -> tuple[float, float]:
    """(greedy agreement, sampled acceptance) of `drafter` over every reply position."""
    agreed, accepted, positions = 0, 0.0, 0
    for r in replies:
        q_logits = reply_logits(drafter, r.prompt, r.reply, width)
        agreed += int((q_logits.argmax(-1) == r.greedy).sum())
        accepted += float(torch.minimum(r.p, probs_from_logits(q_logits, sampling)).sum())
        positions += len(r.reply)
    return agreed / positions, accepted / positions


def compare(
    cfg, target: Target, modes: list[str], replies: list[Reply], sampling: SamplingConfig, say, progress=None
) -> list[dict]:
    from specchat.loading.models import load_model
    from specchat.loading.tokenizer_check import check_pair

    context = target.tokenizer.encode(fixed_text())
    results = []
    for mode in modes:
        drafter, tokenizer, facts = load_model(
            dataclasses.replace(cfg.drafter, quantization=mode), progress, role="drafter", kv_cache=cfg.runtime.kv_cache
        )
        check_pair(target.tokenizer, tokenizer, drafter, target.facts.name, facts.name)
        greedy, sampled = agreement(replies, drafter, target.vocab_size, sampling)
        results.append(
            {
                "mode": mode,
                "quantization": facts.quantization,
                "bytes": facts.memory_bytes,
                "greedy": greedy,
                "sampled": sampled,
                "t1_ms": forward_ms(drafter, context, 1),
                "positions": sum(len(r.reply) for r in replies),
            }
        )
        say(_line(results[-1]))
        del drafter
    return results


def _line(r: dict) -> str:
    return (
        f"{r['quantization']:>22} · {r['bytes'] / 1e6:5.0f} MB · greedy agreement {r['greedy']:.1%} · "
        f"sampled acceptance {r['sampled']:.1%} · T(1) {r['t1_ms']:.1f} ms · {r['positions']} positions"
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.drafters", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair)")
    parser.add_argument("--modes", default="auto-fast,w4a8,none", help="drafter quantizations to compare")
    parser.add_argument("--only", default="", metavar="NAMES", help="only these bench prompts (comma-separated)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="length of each target reply (default 128)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampled acceptance's temperature (default 0.7)")
    parser.add_argument("--top-p", type=float, default=0.9, help="sampled acceptance's top-p (default 0.9)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    return parser.parse_args(argv)


def _checked(args) -> tuple[list[str], SamplingConfig]:
    modes = quantization_modes(args.modes)
    if args.max_new_tokens < 1 or args.temperature <= 0 or not 0 < args.top_p <= 1:
        raise ConfigError("--max-new-tokens ≥ 1, --temperature > 0 and --top-p in (0, 1]")
    return modes, SamplingConfig(temperature=args.temperature, top_p=args.top_p)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    say = lambda line: print(line, flush=True)
    progress = to_stderr()
    try:
        modes, sampling = _checked(args)
        cfg = load_config(args.config, args.overrides)
        if not cfg.drafter.source:
            raise ConfigError("this config has no drafter to compare")
        from specchat.loading.models import load_model

        target = Target(*load_model(cfg.target, progress, role="target", kv_cache=cfg.runtime.kv_cache))
        prompts = [
            render_prompt(target.tokenizer, cfg.ui.system_prompt, p["messages"])
            for p in load_prompts(None, False, args.only)
        ]
        replies = target_replies(target, prompts, args.max_new_tokens, sampling, progress)
        say(
            f"target {target.facts.name} ({target.facts.quantization}): greedy replies to {len(prompts)} "
            f"bench prompt{'s' * (len(prompts) != 1)}; sampled at T {args.temperature} / top-p {args.top_p}"
        )
        compare(cfg, target, modes, replies, sampling, say, progress)
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat bench drafters: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
