"""Greedy speculative vs target-only tok/s on a tiny random pair (8-layer target, its first layer as
drafter), measured side by side in one run:  python scripts/tiny_pair.py"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' tiny models
from tiny_models import build_model, build_tokenizer

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.engine import Engine
from specchat.speculative.events import ReplyDone

SAMPLING = SamplingConfig(max_new_tokens=200)


def reply(engine: Engine, ids: list[int], **speculation) -> ReplyDone:
    engine.reset()
    events = engine.stream(ids, SAMPLING, SpeculationConfig(**speculation))
    return [e for e in events if isinstance(e, ReplyDone)][0]


def main() -> None:
    tok = build_tokenizer()
    target = build_model(len(tok), seed=1, layers=8, hidden=512)
    drafter = copy.deepcopy(target)
    drafter.model.layers = drafter.model.layers[:1]
    drafter.config.num_hidden_layers = 1
    engine = Engine(target, tok, ModelDrafter(drafter, len(tok)), eos_ids=())
    ids = tok.encode("def reverse(lst):")
    reply(engine, ids, gamma=4)  # warm-up
    for _ in range(3):
        t = reply(engine, ids, gamma=0, mode="target")
        s = reply(engine, ids, gamma=4)
        ratio = s.stats.tokens_per_s / t.stats.tokens_per_s
        print(
            f"target-only {t.stats.tokens_per_s:.1f} tok/s · spec γ4 {s.stats.tokens_per_s:.1f} tok/s · "
            f"ratio {ratio:.2f} · acceptance {s.stats.acceptance_rate:.0%} · same {s.ids == t.ids}"
        )


if __name__ == "__main__":
    main()
