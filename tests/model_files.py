"""Model files the tests write and read back: tiny checkpoints saved as a folder or as a GGUF (qwen2
architecture, written with the gguf package), their logits, a greedy reply through a loaded pair, and a
file's later rewrite. Shared by the loading tests and the cache-fault guarantees."""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from tiny_models import CHATML
from transformers import Qwen2Config, Qwen2ForCausalLM

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.loading.models import LoadedPair
from specchat.speculative.drafters.model import ModelDrafter
from specchat.speculative.engine import Engine

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
    engine = Engine(pair.target, pair.tokenizer, drafter, eos_ids=pair.eos_ids, vocab_size=pair.vocab_size)
    events = list(
        engine.stream(ids, SamplingConfig(temperature=0.0, max_new_tokens=n), SpeculationConfig(gamma=gamma, mode=mode))
    )
    return list(events[-1].ids)


def tiny_qwen2(vocab_size: int, seed: int = 5) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    return Qwen2ForCausalLM(config).eval()


TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
CONFIGS = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "phi3": "Phi3Config",
    "gemma2": "Gemma2Config",
    "gemma3": "Gemma3TextConfig",
}  # GGUF architecture → transformers config
GEMMA_TOKENS = ("<mask>",)  # what transformers' Gemma tokenizer adds where a vocabulary lacks it (Gemma's own has it)
EXTRA_TOKENS = {"gemma2": GEMMA_TOKENS, "gemma3": GEMMA_TOKENS}


def tiny_model(architecture: str, vocab_size: int, seed: int = 5, tied: bool = False, **shape):
    """A tiny random model of a GGUF architecture (CONFIGS), float32, its norms drawn away from 1 so that a
    wrong offset or a skipped norm shows; `shape` overrides TINY_SHAPE (head_dim=32: a head size other
    than hidden ÷ heads)."""
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    ids = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0} if architecture == "phi3" else {}  # not 32000
    config = getattr(transformers, CONFIGS[architecture])(
        vocab_size=vocab_size, tie_word_embeddings=tied, **(TINY_SHAPE | ids | shape)
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("norm.weight"):
                value.uniform_(0.5, 1.5)
    return model


def write_gguf(
    path,
    model,
    tokenizer,
    chat_template: str | None = CHATML,
    stored: dict | None = None,
    architecture: str = "qwen2",
    extra_tensors: dict | None = None,
):
    """A float32 GGUF of `architecture` (gpt2-style BPE vocabulary) written with the gguf package as llama.cpp's
    converter writes it: tensor names from gguf's own name map, llama's q/k rows permuted, Gemma's norms
    stored as 1 + w, no output.weight where the model ties it; `stored`: {GGUF tensor name:
    GGMLQuantizationType} for tensors kept in blocks (Q8_0, Q5_0, ...); `extra_tensors`: {name: float32 values}
    written after the model's (rope_freqs.weight)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    _write_gguf_header(writer, model.config, architecture)
    _write_gguf_tokenizer(writer, tokenizer, chat_template, EXTRA_TOKENS.get(architecture, ()))
    for name, values in _gguf_tensors(model, architecture):
        kind = (stored or {}).get(name)
        if kind is None:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_tensors(model, architecture: str):
    """(GGUF name, float32 values) of every tensor the file holds, in state-dict order."""
    import gguf

    arch = {value: key for key, value in gguf.MODEL_ARCH_NAMES.items()}[architecture]
    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    config = model.config
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        module, _, suffix = key.rpartition(".")
        name = f"{names.get_name(module)}.{suffix}"
        values = value.detach().numpy().astype(np.float32)
        if architecture == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            values = _permuted(values, heads)
        if architecture.startswith("gemma") and name.endswith("norm.weight"):
            values = values + 1  # Gemma's norms scale by 1 + w; llama.cpp stores the sum
        yield name, values


def _permuted(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's reordering of a llama q/k projection's rows (LlamaTensorProcessor undoes it)."""
    shape = weights.shape
    return weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _write_gguf_header(writer, config, architecture: str = "qwen2"):
    import gguf

    writer.add_name("Tiny Qwen" if architecture == "qwen2" else f"Tiny {architecture}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if architecture != "qwen2":  # the head size as llama.cpp's converter writes it
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)


def vocab_size(tokenizer, architecture: str = "qwen2") -> int:
    """The rows a model of `architecture` written with this tokenizer has (the file adds EXTRA_TOKENS)."""
    return len(tokenizer) + len(EXTRA_TOKENS.get(architecture, ()))


def _write_gguf_tokenizer(writer, tokenizer, chat_template, extra: tuple[str, ...] = ()):
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])] + list(extra)
    specials = {a["id"] for a in spec["added_tokens"]} | set(range(len(tokens) - len(extra), len(tokens)))
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


# ----- files in the block types people download (tests/loading/test_gguf_types.py) --------------------------------
BLOCK_SCALES = {  # GGML type → (byte offsets of its fp16 scales in a block, their range): weights of about ±0.1
    "Q4_K": ((0, 2), (1e-5, 1e-4)),  # d, dmin; w = d·sc·q − dmin·m, sc and m up to 63, q up to 15
    "Q5_K": ((0, 2), (5e-6, 5e-5)),  # q up to 31
    "Q6_K": ((208,), (5e-6, 2e-5)),  # d last; w = d·scale·(q − 32), int8 scales
    "IQ4_XS": ((0,), (1e-5, 3e-5)),  # w = d·(ls − 32)·kvalue, kvalues −127 … 113
    "IQ4_NL": ((0,), (2e-4, 8e-4)),  # 32-blocks: w = d·kvalue
    "Q3_K": ((108,), (2e-4, 8e-4)),  # d last; w = d·(sc − 32)·(q − 4), 6-bit sc, q 0..7
}


def random_blocks(kind: str, rows: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, width/block·bytes] of `kind` blocks (a BLOCK_SCALES type gguf-py cannot quantize): random bytes,
    small finite fp16 scales."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    weights, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    offsets, (low, high) = BLOCK_SCALES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, width // weights, size), dtype=np.uint8)
    for offset in offsets:
        scale = rng.uniform(low, high, size=(rows, width // weights, 1)).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1)


def write_gguf_in(path, model, tokenizer, kind: str, architecture: str = "qwen2", seed: int = 0):
    """A GGUF whose 2-d weights (embeddings, layers, head) are all `kind` blocks (write_gguf otherwise): gguf-py's
    own quantization of the model's weights where it has one (Q8_0, Q4_0, Q5_0, ...), else random_blocks, so that
    the file's weights are whatever those blocks decode to. Norms and biases stay float32."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_gguf_header(writer, model.config, architecture)
    _write_gguf_tokenizer(writer, tokenizer, CHATML, EXTRA_TOKENS.get(architecture, ()))
    for index, (name, values) in enumerate(_gguf_tensors(model, architecture)):
        if values.ndim != 2:
            writer.add_tensor(name, values)
        elif kind in BLOCK_SCALES:
            writer.add_tensor(name, random_blocks(kind, *values.shape, seed=seed + index), raw_dtype=qtype)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


BLOCK_WIDE = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64}  # every row a whole number of 256-blocks


def typed_pair_files(folder, tokenizer, kind: str, architecture: str):
    """(target file in `kind` blocks, BLOCK_WIDE; float32 drafter file) of one architecture, in `folder`."""
    rows = vocab_size(tokenizer, architecture)
    target = tiny_model(architecture, rows, seed=1, **BLOCK_WIDE)
    drafter = tiny_model(architecture, rows, seed=2)
    return (
        write_gguf_in(folder / "target.gguf", target, tokenizer, kind, architecture=architecture, seed=3),
        write_gguf(folder / "drafter.gguf", drafter, tokenizer, architecture=architecture),
    )
