"""Greedy speculative vs target-only tok/s on a tiny random pair (8-layer target, its first layer as drafter), same run."""
import sys, copy, torch; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
from conftest import build_tokenizer, build_model, make_engine
from specchat.config import SamplingConfig, SpeculationConfig
from specchat.events import ReplyDone
tok = build_tokenizer()
target = build_model(len(tok), seed=1, layers=8, hidden=512)
drafter = copy.deepcopy(target); drafter.model.layers = drafter.model.layers[:1]; drafter.config.num_hidden_layers = 1
ids = tok.encode("def reverse(lst):")
S = SamplingConfig(max_new_tokens=200)
def run(engine, **kw):
    return [e for e in engine.stream(ids, S, SpeculationConfig(**kw)) if isinstance(e, ReplyDone)][0]
e = make_engine(target, drafter, tok)
run(e, gamma=4)
for _ in range(3):
    e.reset(); t = run(e, gamma=0, mode="target"); e.reset(); s = run(e, gamma=4)
    print(f"target-only {t.stats.tokens_per_s:.1f} tok/s · spec γ4 {s.stats.tokens_per_s:.1f} tok/s · ratio {s.stats.tokens_per_s/t.stats.tokens_per_s:.2f} · α {s.stats.acceptance_rate:.2f} · same {s.ids == t.ids}")
