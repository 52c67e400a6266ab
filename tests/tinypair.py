"""A LoadedPair-shaped bundle of the tiny conftest models, so the CLI and REPL run without real models."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from tiny_models import build_model, build_tokenizer

from specchat.speculative.sampling import TORCH_SAMPLER


@dataclass
class Facts:
    name: str
    source: str = "tiny"
    params: int = 0
    dtype: str = "float32"
    quantization: str = "none"
    device: str = "cpu"
    memory_bytes: int = 0
    load_s: float = 0.0
    backend: str = "transformers"


@dataclass
class TinyPair:
    target: object
    drafter: object
    tokenizer: object
    eos_ids: set
    vocab_size: int
    context_limit: int
    target_facts: Facts
    drafter_facts: Facts | None
    progress_calls: list = field(default_factory=list)
    drafter_tokenizer: object = None  # the fields a Pair has past these (speculative/pair.py)
    sampler: object = TORCH_SAMPLER
    pair_check: object = None


def tiny_pair(tokenizer=None, target=None, drafter=None, with_drafter=True, context_limit=1024) -> TinyPair:
    tokenizer = tokenizer or build_tokenizer()
    target = target or build_model(len(tokenizer), seed=1, layers=3)
    if with_drafter and drafter is None:
        drafter = build_model(len(tokenizer), seed=2, layers=1, hidden=32)
    params = sum(p.numel() for p in target.parameters())
    return TinyPair(
        target,
        drafter if with_drafter else None,
        tokenizer,
        {tokenizer.convert_tokens_to_ids("<|im_end|>")},
        len(tokenizer),
        context_limit,
        Facts("tiny-target", params=params),
        Facts("tiny-drafter") if with_drafter else None,
    )


def loader(pair: TinyPair):
    """A load(cfg, progress) function that reports progress and returns `pair`."""

    def load(cfg, progress=None):
        if progress:
            progress("building tiny models", 0.5)
            progress("ready", 1.0)
        pair.progress_calls.append(cfg)
        return pair

    return load


def hold_the_first_reply_until_ctrl_c(model, held_flag: str = "", forwards: int = 3, limit_s: float = 60.0) -> None:
    """A forward pre-hook on `model`: in the first reply that streams (while the REPL's Ctrl-C handler
    is installed, repl.sigint_sets), its `forwards`-th forward creates the file `held_flag` (if given)
    and waits until a Ctrl-C has arrived (at most limit_s), once. A test that sends Ctrl-C once the
    flag exists lands it mid-reply, after earlier steps, on any machine: the reply cannot end first."""
    state = {"forwards": 0, "held": False}

    def hook(module, args):
        handler = signal.getsignal(signal.SIGINT)
        if state["held"] or handler in (signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN, None):
            return
        state["forwards"] += 1
        if state["forwards"] < forwards:
            return
        state["held"], arrived = True, []
        if held_flag:
            open(held_flag, "w").close()

        def interrupted(signum, frame):  # the REPL restores its own handler when the reply ends
            arrived.append(signum)
            handler(signum, frame)

        signal.signal(signal.SIGINT, interrupted)
        deadline = time.monotonic() + limit_s
        while not arrived and time.monotonic() < deadline:
            time.sleep(0.01)

    model.register_forward_pre_hook(hook)
