"""Scratch: collect target features, drafter residuals per layer, and greedy picks on stdlib chunks."""
import sys, time, torch
sys.path.insert(0, "/work/main")
from specchat.settings import load_config
from specchat.loading.models import load_pair
from specchat.runtime.lean import LeanForward, rms_norm
from specchat.training.head_training import default_sources, text_files, token_chunks, target_states, output_rows
from specchat.speculative import model_io

CHUNKS = int(sys.argv[1]); LAYERS = [12, 16, 18, 20, 22]; VIEW = 32768
torch.set_num_threads(2)
cfg = load_config(None, [])
pair = load_pair(cfg)
target, drafter, tok = pair.target, pair.drafter, pair.tokenizer
rows_t = output_rows(target.get_output_embeddings(), VIEW)
rows_d = output_rows(drafter.get_output_embeddings(), VIEW)
lf = LeanForward(drafter, None, "float16")

@torch.inference_mode()
def drafter_residuals(ids):
    cache = lf.new_kv_cache()
    fed = len(ids); cache.make_room(fed); lf._tables(cache.capacity)
    cos = {k: t[:fed] for k, t in lf._cos.items()}; sin = {k: t[:fed] for k, t in lf._sin.items()}
    hidden = lf.embed(torch.tensor([ids]))
    mask = lf._causal_mask(0, fed, None)
    out = {}
    for i, layer in enumerate(lf.layers):
        if i in LAYERS: out[i] = hidden[0].clone()
        hidden = lf._layer(layer, cache, i, hidden, cos[None], sin[None], mask, 0)
    final = rms_norm(lf.norm, hidden)[0]
    return out, final

data = []
t0 = time.time()
for n, ids in enumerate(token_chunks(text_files(default_sources()), tok, 512)):
    if n >= CHUNKS: break
    if len(ids) < 512: continue
    F = target_states(target, ids)
    res, final = drafter_residuals(ids)
    data.append({"ids": ids, "F": F.half(), "R": {k: v.half() for k, v in res.items()},
                 "tpick": (F @ rows_t.T).argmax(-1), "dpick": (final @ rows_d.T).argmax(-1)})
    print(n, len(ids), f"{time.time()-t0:.0f}s", flush=True)
torch.save(data, "/root/graft/data.pt")
