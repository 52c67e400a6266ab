"""Model files the tests write and read back: tiny checkpoints saved as a folder or as a GGUF (qwen2
architecture, written with the gguf package), their logits, a greedy reply through a loaded pair, and a
file's later rewrite. Shared by the loading tests and the cache-fault guarantees."""
from __future__ import annotations

import json
import os

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tiny_models import CHATML
from specchat.config import SamplingConfig, SpeculationConfig
from specchat.loading.models import LoadedPair
from specchat.spec.drafters.model import ModelDrafter
from specchat.spec.engine import Engine

PROMPT = "def reverse(lst):"


def save_dir(path, model, tokenizer):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def logits(model, tokenizer, text=PROMPT):
    with torch.inference_mode():
        return model(torch.tensor([tokenizer.encode(text)])).logits.float()


def greedy_reply(pair: LoadedPair, mode: str, ids: list[int], n: int = 24, gamma: int = 4) -> list[int]:
    drafter = ModelDrafter(pair.drafter, pair.vocab_size) if pair.drafter is not None else None
    engine = Engine(pair.target, pair.tokenizer, drafter, eos_ids=pair.eos_ids,
                    vocab_size=pair.vocab_size)
    events = list(engine.stream(ids, SamplingConfig(temperature=0.0, max_new_tokens=n),
                                SpeculationConfig(gamma=gamma, mode=mode)))
    return list(events[-1].ids)


GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


GGUF_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                  "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def tiny_qwen2(vocab_size: int, seed: int = 5) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-6,
                         rope_theta=10000.0)
    return Qwen2ForCausalLM(config).eval()


def write_gguf(path, model, tokenizer, chat_template: str | None = CHATML, stored: dict | None = None):
    """A float32 GGUF (qwen2 architecture, gpt2-style BPE vocabulary) written with the gguf package;
    `stored`: {GGUF tensor name: GGMLQuantizationType} for tensors kept in blocks (Q8_0, Q5_0, ...)."""
    import gguf
    writer = gguf.GGUFWriter(str(path), "qwen2")
    _write_gguf_header(writer, model.config)
    _write_gguf_tokenizer(writer, tokenizer, chat_template)
    for key, value in model.state_dict().items():
        if key.startswith("model.layers."):
            _, _, layer, rest = key.split(".", 3)
            name = f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"
        else:
            name = GGUF_TOP_NAMES[key]
        values = value.detach().numpy().astype(np.float32)
        kind = (stored or {}).get(name)
        if kind is None:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_gguf_header(writer, config):
    import gguf
    writer.add_name("Tiny Qwen")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def _write_gguf_tokenizer(writer, tokenizer, chat_template):
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {a["id"] for a in spec["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def later(path):
    """Date a rewrite a second later, as a real later corruption is (mtimes tick coarsely)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
