"""Every GGUF architecture specchat runs × every block type it reads, as a user loads them (issue 52's table).

Per case: a tiny random target in that type's blocks and a float32 drafter of the same architecture, written by the
gguf package as the loading tests write them (tests/model_files.py's typed_pair_files; run from the repository root), loaded with the
default config; then the target's path (the lean forward and its compiled layers, or transformers; the w4a8 levels;
the file's blocks as stored or requantized), whether greedy speculative gives target-only's tokens, and tok/s of
each (tiny models: the figures show overheads, not speed). A case that fails to load is a row with its error.

    python scripts/arch_matrix.py [--tokens 24] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
KINDS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K")
HEADER = "| architecture | type | path | exact | target-only tok/s | speculative tok/s |\n|---|---|---|---|---|---|"


def timed_reply(pair, mode: str, ids: list[int], tokens: int) -> tuple[list[int], float]:
    """A greedy reply's ids and its tok/s."""
    from model_files import greedy_reply

    start = time.perf_counter()
    reply = greedy_reply(pair, mode, ids, n=tokens)
    return reply, len(reply) / (time.perf_counter() - start)


def levels(model) -> str:
    """The w4a8 layers' level widths, e.g. "4-bit" or "4/6-bit"; "no w4a8" without any."""
    from specchat.quant.w4a8 import Q4Linear

    bits = sorted({module.tiles.bits for module in model.modules() if isinstance(module, Q4Linear)})
    return "w4a8 " + "/".join(map(str, bits)) + "-bit levels" if bits else "no w4a8"


def row(tok, kind: str, architecture: str, tokens: int) -> str:
    """One case's table row."""
    from model_files import typed_pair_files

    from specchat.errors import one_line
    from specchat.loading.models import load_pair
    from specchat.settings import load_config

    with tempfile.TemporaryDirectory() as folder:
        os.environ["SPECCHAT_CACHE"] = str(Path(folder) / "cache")
        said: list[str] = []
        try:
            target, drafter = typed_pair_files(Path(folder), tok, kind, architecture)
            config = load_config(None, [f"target.source={target}", f"drafter.source={drafter}"])
            pair = load_pair(config, lambda message, fraction: said.append(str(message)))
        except Exception as err:  # a row, not the end of the table
            return f"| {architecture} | {kind} | failed: {one_line(err, 120)} | | | |"
        chat = [{"role": "user", "content": "def reverse(lst):"}]
        ids = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
        timed_reply(pair, "target", ids, 4)  # warm
        alone, alone_speed = timed_reply(pair, "target", ids, tokens)
        spec, spec_speed = timed_reply(pair, "spec", ids, tokens)
        blocks = "requantized" if any("requantized" in line for line in said) else "as stored"
        path = f"{pair.target_facts.backend}, {levels(pair.target)}, {blocks}"
        exact = "yes" if spec == alone else "NO"
        return f"| {architecture} | {kind} | {path} | {exact} | {alone_speed:.0f} | {spec_speed:.0f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests")]
    import torch
    from tiny_models import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    lines = [HEADER]
    print(HEADER, flush=True)
    for architecture in ARCHITECTURES:
        for kind in KINDS:
            lines.append(row(tok, kind, architecture, args.tokens))
            print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if any("| NO |" in line or "failed:" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
