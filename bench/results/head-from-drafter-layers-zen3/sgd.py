"""Scratch: an adapter from (target feature at t-1, drafter embedding of x_t) into the float drafter's layer L,
trained through its frozen layers L.. and head with CE against the target's greedy pick; held-out agreement."""
import sys, time, random, torch
from torch import nn
from transformers import AutoConfig, Qwen2ForCausalLM

torch.set_num_threads(2); torch.manual_seed(0); random.seed(0)
L = int(sys.argv[1]); EPOCHS = int(sys.argv[2]); LR = float(sys.argv[3]); WIDTH = 1024
data = torch.load("/root/graft/data.pt")
held = [d for i, d in enumerate(data) if i % 10 == 9]; train = [d for i, d in enumerate(data) if i % 10 != 9]
cfg = AutoConfig.from_pretrained("/root/graft/dcfg")
model = Qwen2ForCausalLM(cfg); model.load_state_dict(torch.load("/root/graft/drafter_float.pt"), strict=False)
model.model.layers = nn.ModuleList(list(model.model.layers)[L:])
for i, layer in enumerate(model.model.layers): layer.self_attn.layer_idx = i
model.config.num_hidden_layers = 24 - L
if getattr(model.config, "layer_types", None): model.config.layer_types = model.config.layer_types[L:]
model.eval(); [p.requires_grad_(False) for p in model.parameters()]
rows = model.lm_head.weight[:32768]
embed = model.model.embed_tokens

def inputs(d):
    e = embed(torch.tensor(d["ids"][1:])).float()
    return torch.cat([d["F"][:-1].float(), e, torch.ones(e.shape[0], 1)], 1)

X = torch.cat([inputs(d) for d in train]).double(); G = X.T @ X
Y = torch.cat([d["R"][L][1:].float() for d in train]).double()
W = torch.linalg.solve(G + 1e-3 * G.diagonal().mean() * torch.eye(G.shape[0], dtype=G.dtype), X.T @ Y).float()

class Adapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Parameter(W.clone())
        self.up = nn.Linear(X.shape[1], WIDTH); self.down = nn.Linear(WIDTH, 896)
        nn.init.zeros_(self.down.weight); nn.init.zeros_(self.down.bias)
    def forward(self, x):
        return x @ self.lin + self.down(nn.functional.silu(self.up(x)))

adapter = Adapter()
opt = torch.optim.AdamW(adapter.parameters(), lr=LR)

def logits(d, grad):
    with torch.set_grad_enabled(grad):
        h = torch.cat([d["R"][L][:1].float(), adapter(inputs(d))])[None]
        hidden = model.model(inputs_embeds=h, use_cache=False).last_hidden_state[0]
        return hidden @ rows.T

def evaluate():
    agree = total = 0
    with torch.no_grad():
        for d in held:
            p = logits(d, False).argmax(-1)
            agree += int((p[1:] == d["tpick"][1:]).sum()); total += len(d["ids"]) - 1
    return agree / total

print(f"L {L}: ridge start held-out {evaluate():.3f}", flush=True)
t0 = time.time()
for epoch in range(EPOCHS):
    random.shuffle(train); losses = []
    for d in train:
        loss = nn.functional.cross_entropy(logits(d, True)[1:], d["tpick"][1:])
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(float(loss))
    print(f"epoch {epoch + 1}: loss {sum(losses) / len(losses):.3f}, held-out {evaluate():.3f}, {time.time() - t0:.0f}s", flush=True)
