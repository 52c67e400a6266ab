"""Count host syncs: every Python-level read of a tensor's values to the host (`item`, `tolist`, `int(t)`,
`float(t)`, `bool(t)`, `range(t)`, `numpy`, `cpu`). On a GPU each one waits for all queued work. On the CPU they
are free, but counting them here tells what a GPU step would wait for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu")


class Reads:
    def __init__(self):
        self.count = 0
        self.on = True


@contextlib.contextmanager
def counting_reads() -> Iterator[Reads]:
    """Count reads while the block runs (reads.on = False pauses the count)."""
    reads = Reads()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(original):
        def read(self, *args, **kwargs):
            if reads.on:
                reads.count += 1
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def reads_per_step(engine, prompt_ids, sampling, speculation) -> list[tuple[int, int, int]]:
    """(reads, drafted, accepted) for each step of one reply; the first step's count includes reading the prompt."""
    counts = []
    with counting_reads() as reads:
        for item in engine.steps(prompt_ids, sampling, speculation):
            if hasattr(item, "drafted"):
                counts.append((reads.count, item.drafted, item.accepted))
                reads.count = 0
    return counts
