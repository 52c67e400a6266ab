"""A load test of a running `specchat serve` on loopback: N requests from C concurrent clients, a share of them
leaving mid-stream; every completed reply is checked against the same prompt's first reply (greedy: equal).

    python scripts/serve_load.py [--url http://127.0.0.1:8080] [--requests 200] [--clients 16] [--leave-every 3]
                                 [--max-tokens 8]

A client answered 429 waits the Retry-After seconds and asks again (--retries times). Prints the outcome counts
(ok, left, 429, wrong, error, hung) and the 429 answers seen, the server's resident memory before and after
(/health), and the wall time. Exits 1 if any reply was wrong, any request failed other than 429, or any hung.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, TimeoutError

import httpx

from specchat.serve.protocol import streamed_text

PROMPTS = ["Say hello.", "Name three colours.", "What is 2+2?", "Reverse a list in Python.", "Define KV cache."]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--leave-every", type=int, default=3, help="every Nth request leaves mid-stream")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a request counts as hung")
    parser.add_argument(
        "--retries", type=int, default=100, help="times a client answered 429 waits Retry-After and asks again"
    )
    return parser.parse_args(argv)


def one_request(url: str, n: int, args, expected: dict[str, str], refusals: Counter) -> str:
    """One client's request, asked again after each 429 (up to --retries): its outcome."""
    for _ in range(args.retries + 1):
        outcome, wait = attempt(url, n, args, expected)
        if outcome != "429":
            return outcome
        refusals["429"] += 1
        time.sleep(wait)
    return "429"


def attempt(url: str, n: int, args, expected: dict[str, str]) -> tuple[str, float]:
    text = PROMPTS[n % len(PROMPTS)]
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens, "temperature": 0}
    try:
        with httpx.Client(timeout=args.timeout) as client:
            if args.leave_every and n % args.leave_every == 0:
                with client.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as reply:
                    if reply.status_code == 429:
                        return "429", float(reply.headers.get("retry-after", 1))
                    next(reply.iter_lines())
                return "left", 0.0
            stream = n % 2 == 1
            reply = client.post(f"{url}/v1/chat/completions", json={**body, "stream": stream})
            if reply.status_code == 429:
                return "429", float(reply.headers.get("retry-after", 1))
            if reply.status_code != 200:
                return "error", 0.0
            got = streamed_text(reply.text) if stream else reply.json()["choices"][0]["message"]["content"]
            return ("ok" if got == expected[text] else "wrong"), 0.0
    except httpx.TimeoutException:
        return "hung", 0.0
    except httpx.HTTPError:
        return "error", 0.0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    url = args.url.rstrip("/")
    with httpx.Client(timeout=args.timeout) as client:
        before = client.get(f"{url}/health").json()
        expected = {}
        for text in PROMPTS:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens, "temperature": 0}
            expected[text] = client.post(f"{url}/v1/chat/completions", json=body).json()["choices"][0]["message"][
                "content"
            ]
    began = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        refusals: Counter = Counter()
        futures = [pool.submit(one_request, url, n, args, expected, refusals) for n in range(args.requests)]
        outcomes: Counter = Counter()
        for future in futures:
            try:
                outcomes[future.result(timeout=args.timeout)] += 1
            except TimeoutError:
                outcomes["hung"] += 1
    seconds = time.perf_counter() - began
    time.sleep(1.0)
    with httpx.Client(timeout=args.timeout) as client:
        after = client.get(f"{url}/health").json()
    print(
        f"{args.requests} requests, {args.clients} clients, every {args.leave_every}rd leaving mid-stream, "
        f"{args.max_tokens} tokens each: {dict(outcomes)} in {seconds:.1f} s ({refusals['429']} answers 429, each "
        f"asked again after Retry-After); server resident "
        f"{before['resident_bytes'] / 2**20:.0f} MiB before, {after['resident_bytes'] / 2**20:.0f} MiB after; "
        f"admitted now {after['admitted']}; replies by stop reason {after['replies']}"
    )
    bad = outcomes["wrong"] + outcomes["error"] + outcomes["hung"]
    return 1 if bad or after["admitted"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
