"""/compare drafters: rerun the last prompt with each available drafter, and with none, side by side.

Every run gets a fresh engine on the same loaded models (empty caches, a copy of the chat's gamma
policy) and the same seed, so the chat's history and caches are untouched and the runs are fair.
"""
from __future__ import annotations

import copy
import dataclasses
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from specchat.spec.drafters.model import ModelDrafter
from specchat.spec.engine import Engine
from specchat.spec.events import ReplyEnd
from specchat.spec.metrics import ReplyStats
from specchat.spec.drafters.self_layers import layer_count, self_layers

NO_DRAFTER = "none"


@dataclass(frozen=True)
class RaceRun:
    drafter: str          # model | lookup | self:N | none (the target alone)
    stats: ReplyStats
    speedup: float        # tok/s over the target-only run's


def fresh_engine(engine: Engine) -> Engine:
    """An engine on `engine`'s models with caches of its own and a copy of its gamma policy."""
    model = engine.drafters.get("model")
    drafter = ModelDrafter(model.model, model.vocab_size) if model is not None else None
    return Engine(engine.target, engine.tokenizer, drafter, engine.eos_ids, engine.vocab_size,
                  copy.deepcopy(engine.policy))


def contenders(engine: Engine, current: str) -> list[str]:
    """None, the drafter model if loaded, lookup, auto (with a model), and a self drafter: the current one if it is self:N,
    else the target's first quarter of layers."""
    names = [NO_DRAFTER, *(name for name in ("model", "lookup") if name in engine.drafters)]
    names += ["auto"] if engine.has_model_drafter else []  # with no model, auto is lookup alone
    if self_layers(current) is None:
        current = f"self:{max(1, layer_count(engine.target) // 4)}"
    return names + ([current] if engine.drafter_problem(current) is None else [])


def race(session, cancel: threading.Event) -> Iterator[RaceRun]:
    """Each contender's run on the last prompt, as it finishes (the target alone first, the speedups
    relative to it). Stops early when `cancel` is set. Raises ValueError before any reply."""
    if not session.records:
        raise ValueError("no reply yet: /compare drafters reruns the last prompt with each drafter")
    cfg = session.config
    seed = cfg.sampling.seed if cfg.sampling.seed >= 0 else random.randrange(2**63)
    sampling = dataclasses.replace(session.sampling_for(session.last_prompt_ids), seed=seed)
    base = None
    for name in contenders(session.engine, cfg.speculation.drafter):
        mode, drafter = ("target", "model") if name == NO_DRAFTER else ("spec", name)
        speculation = dataclasses.replace(cfg.speculation, mode=mode, drafter=drafter)
        final = None
        for item in fresh_engine(session.engine).steps(session.last_prompt_ids, sampling, speculation, cancel):
            final = item if isinstance(item, ReplyEnd) else final
        if final is None or final.stop_reason == "cancelled":
            return
        base = base or final.stats.tokens_per_s
        yield RaceRun(name, final.stats, final.stats.tokens_per_s / base if base else 0.0)
