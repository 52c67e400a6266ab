"""Scratch: ridge-fit the drafter's layer-L residual from (target feature at t-1, drafter embedding of x_t); run the
drafter's layers L.. over the fitted residuals; greedy agreement with the target on held-out chunks."""
import sys, time, torch
sys.path.insert(0, "/work/main")
from specchat.settings import load_config
from specchat.loading.models import load_pair
from specchat.runtime.lean import LeanForward, rms_norm
from specchat.training.head_training import output_rows

torch.set_num_threads(2)
LAYERS = [int(a) for a in sys.argv[1].split(",")]; LAM = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-3
data = torch.load("/root/graft/data.pt")
held = [d for i, d in enumerate(data) if i % 10 == 9]; train = [d for i, d in enumerate(data) if i % 10 != 9]
cfg = load_config(None, ["target.source=", "speculation.mode=drafter"]) if False else load_config(None, [])
pair = load_pair(cfg)
drafter = pair.drafter
rows_d = output_rows(drafter.get_output_embeddings(), 32768)
lf = LeanForward(drafter, None, "float16")
embed = drafter.get_input_embeddings()

def inputs(d):
    with torch.inference_mode():
        e = embed(torch.tensor(d["ids"][1:])).float()
    return torch.cat([d["F"][:-1].float(), e, torch.ones(e.shape[0], 1)], 1)

@torch.inference_mode()
def run_from(L, hidden):
    cache = lf.new_kv_cache(); fed = hidden.shape[0]; cache.make_room(fed); lf._tables(cache.capacity)
    cos = {k: t[:fed] for k, t in lf._cos.items()}; sin = {k: t[:fed] for k, t in lf._sin.items()}
    mask = lf._causal_mask(0, fed, None); h = hidden[None]
    for i in range(L, len(lf.layers)):
        h = lf._layer(lf.layers[i], cache, i, h, cos[None], sin[None], mask, 0)
    return (rms_norm(lf.norm, h)[0] @ rows_d.T).argmax(-1)

Xs = [inputs(d) for d in train]
X = torch.cat(Xs).double()
base = sum(int((d["dpick"][1:] == d["tpick"][1:]).sum()) for d in held); count = sum(len(d["ids"]) - 1 for d in held)
print(f"train positions {X.shape[0]}, held {count}; full drafter agreement {base / count:.3f}")
G = X.T @ X
for L in LAYERS:
    Y = torch.cat([d["R"][L][1:].float() for d in train]).double()
    lam = LAM * G.diagonal().mean()
    W = torch.linalg.solve(G + lam * torch.eye(G.shape[0], dtype=G.dtype), X.T @ Y).float()
    agree = total = 0; r2n = r2d = 0.0
    for d in held:
        Xh = inputs(d); Yh = d["R"][L][1:].float(); P = Xh @ W
        r2n += float(((P - Yh) ** 2).sum()); r2d += float(((Yh - Yh.mean(0)) ** 2).sum())
        hidden = torch.cat([d["R"][L][:1].float(), P])
        picks = run_from(L, hidden)
        agree += int((picks[1:] == d["tpick"][1:]).sum()); total += len(d["ids"]) - 1
    sanity = run_from(L, held[0]["R"][L].float())
    print(f"L {L} (head of {24 - L} layers): held-out agreement {agree / total:.3f}; R2 {1 - r2n / r2d:.3f}; "
          f"true-residual sanity {(sanity == held[0]['dpick']).float().mean():.3f}", flush=True)

# ----- draft 2: the next input from the head's own final state g[t] and the drafted token's embedding -----
L = LAYERS[-1] if len(sys.argv) < 4 else int(sys.argv[3])
Y = torch.cat([d["R"][L][1:].float() for d in train]).double()
W = torch.linalg.solve(G + LAM * G.diagonal().mean() * torch.eye(G.shape[0], dtype=G.dtype), X.T @ Y).float()

@torch.inference_mode()
def final_states(L, hidden, cache=None):
    cache = cache or lf.new_kv_cache(); fed = hidden.shape[0]; cache.make_room(fed); lf._tables(cache.capacity)
    cos = {k: t[:fed] for k, t in lf._cos.items()}; sin = {k: t[:fed] for k, t in lf._sin.items()}
    mask = lf._causal_mask(0, fed, None); h = hidden[None]
    for i in range(L, len(lf.layers)):
        h = lf._layer(lf.layers[i], cache, i, h, cos[None], sin[None], mask, 0)
    cache.length = fed
    return rms_norm(lf.norm, h)[0], cache

def teacher(d):
    Xh = inputs(d); return torch.cat([d["R"][L][:1].float(), Xh @ W])

X2s, Y2s = [], []
for d in train:
    g, _ = final_states(L, teacher(d))
    with torch.inference_mode():
        e = embed(torch.tensor(d["ids"][2:])).float()
    X2s.append(torch.cat([g[1:-1], e, torch.ones(e.shape[0], 1)], 1)); Y2s.append(d["R"][L][2:].float())
X2 = torch.cat(X2s).double(); Y2 = torch.cat(Y2s).double(); G2 = X2.T @ X2
W2 = torch.linalg.solve(G2 + LAM * G2.diagonal().mean() * torch.eye(G2.shape[0], dtype=G2.dtype), X2.T @ Y2).float()
agree1 = agree2 = total = 0
for d in held:
    hidden = teacher(d); g, cache = final_states(L, hidden)
    picks = (g @ rows_d.T).argmax(-1)
    with torch.inference_mode():
        emb = embed(torch.tensor(d["ids"])).float()
    for t in range(len(d["ids"]) - 3, 0, -5):  # descending: a row fed at t+1 overwrites only what later ones skip
        s = torch.cat([g[t], emb[t + 1], torch.ones(1)]) @ W2
        cos = {k: v[t + 1 : t + 2] for k, v in lf._cos.items()}; sin = {k: v[t + 1 : t + 2] for k, v in lf._sin.items()}
        h = s[None, None]
        with torch.inference_mode():
            for i in range(L, len(lf.layers)):
                h = lf._layer(lf.layers[i], cache, i, h, cos[None], sin[None], None, t + 1)
            pick = int((rms_norm(lf.norm, h)[0] @ rows_d.T).argmax(-1))
        agree2 += pick == int(d["tpick"][t + 1]); agree1 += int(picks[t + 1] == d["tpick"][t + 1]); total += 1
print(f"L {L}: at {total} held-out positions, draft-1 agreement {agree1 / total:.3f}, draft-2 (from own state) {agree2 / total:.3f}")
