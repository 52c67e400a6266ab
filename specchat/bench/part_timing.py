"""Timing a forward by part: matmuls (of which the kernels), attention, and the rest, with hooks on the
modules, wrappers on the kernels' Python entry points and the compiled layer loop's own stopwatches
(bench/profile.py and bench/prefill.py report them)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

from torch import nn

from specchat.quant import w4a8, w8a8
from specchat.runtime import lean
from specchat.speculative import model_io

PARTS = ("matmuls", "kernel", "attention", "other")


class PartTimer:
    """Timing hooks: seconds inside linear layers, inside attention modules, and inside the linear
    layers that attention modules call (their projections), summed over every call."""

    def __init__(self, modules: list[nn.Module]):
        self.seconds: dict[str, float] = defaultdict(float)
        self._starts: dict[int, float] = {}
        self._in_attention = 0
        self.in_shared = 0  # inside w8a8.same_input, timed as a whole as "linear"
        self._handles = []
        for module in {id(m): m for root in modules for m in root.modules()}.values():
            kind = _kind(module)
            if kind:
                self._handles.append(module.register_forward_pre_hook(self._enter(kind)))
                self._handles.append(module.register_forward_hook(self._leave(kind)))

    def _enter(self, kind: str):
        def hook(module, _args) -> None:
            self._in_attention += kind == "attention"
            self._starts[id(module)] = time.perf_counter()

        return hook

    def _leave(self, kind: str):
        def hook(module, _args, _out) -> None:
            elapsed = time.perf_counter() - self._starts.pop(id(module))
            if kind == "linear" and self.in_shared:
                return
            self.seconds[kind] += elapsed
            if kind == "attention":
                self._in_attention -= 1
            elif self._in_attention:
                self.seconds["projections"] += elapsed

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _kind(module: nn.Module) -> str | None:
    """'linear' for any linear layer (torch, bitsandbytes, int8, w8a8), 'attention' for self-attention."""
    name = type(module).__name__
    if isinstance(module, nn.Linear) or name.endswith("Linear"):
        return "linear"
    if name.endswith("Attention"):
        return "attention"
    return None


@contextmanager
def timed_function(owner, name: str, seconds: dict[str, float], key: str, timer: PartTimer | None = None, nested=""):
    """Count the time of calls to `owner.name` (a module's function, a class's method, an object's) into
    seconds[key]; with a timer, linear modules called inside are not counted again; with `nested`, what
    seconds[nested] gained during a call is not counted in seconds[key] (the drafter's forwards inside its propose)."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start, inner = time.perf_counter(), seconds[nested] if nested else 0.0
        if timer:
            timer.in_shared += 1
        try:
            return original(*args, **kwargs)
        finally:
            if timer:
                timer.in_shared -= 1
            seconds[key] += time.perf_counter() - start - ((seconds[nested] - inner) if nested else 0.0)

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def timed_calls(timer: PartTimer):
    """w8a8's and w4a8's kernel calls; the lean forward's attention (it calls no attention module) and
    its linear layers that share one input (they skip their modules' forward)."""
    seconds = timer.seconds
    with (
        timed_function(w8a8, "_int8_product", seconds, "kernel"),
        timed_function(w4a8, "run_kernel", seconds, "kernel"),
        timed_function(lean, "batch_invariant_attention", seconds, "lean attention"),
        timed_function(lean, "same_input", seconds, "linear", timer),
    ):
        yield


@contextmanager
def compiled_parts(modules: list[nn.Module], seconds: dict[str, float]):
    """The parts timed inside the lean forward's compiled layer loops (lean_layers.cpp), which no
    Python hook sees: their kernel, matmul and attention seconds are added to `seconds`."""
    leans = [getattr(module, model_io.RUNNER, None) for module in modules]
    loops = [loop for loop in (lean.native_loop() for lean in leans if lean is not None) if loop is not None]
    for loop in loops:
        loop.time_parts(True)
    try:
        yield
    finally:
        for loop in loops:
            kernel, matmuls, attention, _total = loop.part_seconds()
            seconds["kernel"] += kernel
            seconds["linear"] += matmuls
            seconds["lean attention"] += attention
            loop.time_parts(False)


def split_forward(modules: list[nn.Module], run, reset, repeats: int) -> dict[str, float]:
    """Median ms of `run()` (then `reset()`, untimed) in total and split by part.

    The total comes from runs without hooks; the split from as many hooked runs, scaled onto it.
    """
    totals = [seconds_of(run, reset) for _ in range(repeats)]
    timer, parts = PartTimer(modules), []
    try:
        for _ in range(repeats):
            timer.seconds.clear()
            with timed_calls(timer), compiled_parts(modules, timer.seconds):
                total = seconds_of(run, reset)
            parts.append(_parts(timer.seconds, total))
    finally:
        timer.remove()
    scale = statistics.median(totals) / statistics.median(p["total"] for p in parts)
    split = {part: statistics.median(p[part] for p in parts) * scale * 1e3 for part in PARTS}
    return split | {"total": statistics.median(totals) * 1e3}


def _parts(seconds: dict[str, float], total: float) -> dict[str, float]:
    linear = seconds.get("linear", 0.0)
    attention = seconds.get("attention", 0.0) - seconds.get("projections", 0.0) + seconds.get("lean attention", 0.0)
    return {
        "matmuls": linear,
        "kernel": seconds.get("kernel", 0.0),
        "attention": attention,
        "other": total - linear - attention,
        "total": total,
    }


def seconds_of(run, reset) -> float:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    reset()
    return seconds
