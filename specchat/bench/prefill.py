"""How fast each model reads a prompt (prefill), and where that time goes.

    python -m specchat.bench.profile --prefill 512 2048 8192 [--chunk 128]

Each model of the pair reads a prompt of N tokens into an empty cache, `chunk` tokens a forward as the
chat reads a pasted prompt (speculative/model_io.py's PREFILL_CHUNK unless told), once untimed by hooks for
the total and once with them for the split: matmuls (of which the w4a8 kernel), attention, and the rest.
"""

from __future__ import annotations

from specchat.bench.part_timing import split_forward
from specchat.speculative import model_io


def prompt_ids(tokenizer, text: str, length: int) -> list[int]:
    """`length` token ids of `text`, repeated as often as it takes."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError("the prompt text encodes to no tokens")
    return (ids * (length // len(ids) + 1))[:length]


def prefill_rows(pair, ids: list[int], lengths: list[int], chunk: int) -> dict[str, dict]:
    """Per model and length: the profile's split of reading ids[:length] (ms) and its tokens a second."""
    models = [("target", pair.target)] + ([("drafter", pair.drafter)] if pair.drafter is not None else [])
    rows = {}
    for name, model in models:
        for length in lengths:
            cache = model_io.new_kv_cache(model)
            prompt = ids[:length]

            def read(model=model, cache=cache, prompt=prompt) -> None:
                for start in range(0, len(prompt), chunk):
                    model_io.forward(model, cache, prompt[start : start + chunk], keep=1)

            split = split_forward([model], read, lambda cache=cache: model_io.crop_to(cache, 0), repeats=1)
            rows[f"{name} · {length} tokens"] = split | {"tokens/s": length / split["total"] * 1e3}
    return rows


def prefill_table(rows: dict[str, dict], chunk: int) -> str:
    lines = [
        f"| prompt read in chunks of {chunk} | tokens/s | total s | matmuls | (of which the kernel) | attention "
        "| other |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        shares = [f"{r[part] / r['total']:.0%}" for part in ("matmuls", "kernel", "attention", "other")]
        lines.append(f"| {name} | {r['tokens/s']:.1f} | {r['total'] / 1e3:.1f} | " + " | ".join(shares) + " |")
    return "\n".join(lines)
