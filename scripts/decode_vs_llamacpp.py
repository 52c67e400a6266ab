"""Target-only decode, specchat against llama.cpp (llama-cpp-python) on the same GGUF files, both loaded in one
process and taken in turns, so the machine's state is the same for both:

    python scripts/decode_vs_llamacpp.py FILE.gguf [FILE.gguf ...] [--tokens 64] [--rounds 3] [--threads 2]

For each file: specchat's default config with that file as the target and no drafter, greedy, `--tokens` new tokens
after a short prompt (its generation rate, the prompt's reading apart), then llama.cpp's greedy generate of as many
tokens after evaluating the same prompt ids; `--rounds` times each; the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime object."


def llamacpp_rate(llama, ids: list[int], tokens: int) -> float:
    llama.reset()
    llama.eval(ids)
    start, made = time.perf_counter(), 0
    for _token in llama.generate(ids, reset=False, temp=0.0, top_k=1):
        made += 1
        if made >= tokens:
            break
    return made / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    from llama_cpp import Llama

    import specchat

    torch.set_num_threads(args.threads)
    for path in args.files:
        pair = specchat.load_pair(**{"target.source": path, "drafter.source": "", "speculation.mode": "target"})
        llama = Llama(model_path=path, n_ctx=512, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
        ids = pair.tokenizer.encode(PROMPT)
        ours, theirs = [], []
        for _ in range(args.rounds):
            done = specchat.autoregressive_generate(ids, pair.target, max_new_tokens=args.tokens)
            ours.append(done.stats.generation_tokens_per_s)
            theirs.append(llamacpp_rate(llama, ids, args.tokens))
        mine, peer = statistics.median(ours), statistics.median(theirs)
        print(f"{path}: specchat {mine:.1f} tok/s · llama.cpp {peer:.1f} tok/s · {mine / peer:.2f}×", flush=True)
        del pair, llama


if __name__ == "__main__":
    main()
