"""Checkpoints at real shapes with random weights, built offline: the GPU check's models.

No model can be downloaded on the GPU machine, and the bundled GGUF pair is larger than one command can carry, so
the GPU bench builds Qwen2-architecture models from the shapes below (the bundled pair's, and a 7B's) with a seeded
random init, writes each once as a checkpoint folder (safetensors) with a word-level tokenizer as wide as the
model's vocabulary, and loads it through the chat's own loader (so bf16, bitsandbytes nf4 and 8-bit take the
chat's paths). Random weights make acceptance meaningless, so the bench also runs pairs whose acceptance is known
by construction (the target drafting for itself; its own weights in nf4 drafting for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False


# The bundled pair's shapes (Qwen2.5-Coder-1.5B and 0.5B) and Qwen2.5-7B's; "tiny" for a CPU check of the bench.
SHAPES = {
    "tiny": Shape(64, 128, 2, 4, 2, 512),
    "0.5b": Shape(896, 4864, 24, 14, 2, 151936, tied=True),
    "1.5b": Shape(1536, 8960, 28, 12, 2, 151936, tied=True),
    "7b": Shape(3584, 18944, 28, 28, 4, 152064),
}
INIT_STD = 0.02  # transformers' own initializer_range for these models
END = "<|endoftext|>"


def qwen2_config(shape: Shape) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=shape.tied,
        initializer_range=INIT_STD,
        eos_token_id=shape.vocab - 1,
        bos_token_id=None,
        pad_token_id=shape.vocab - 1,
    )


def byte_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer as wide as the model's head, no training: the 256 byte symbols, then fillers w256 …,
    and the last id "<|endoftext|>", the end of turn (the name Qwen2's tokenizer class adds when it lacks it, so
    transformers, which loads the folder as the architecture's own tokenizer, keeps the width). Text encodes a
    byte a token; random weights rarely pick the end of turn, so replies run to their length."""
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    words = {symbol: i for i, symbol in enumerate(symbols)}
    words.update({f"w{i}": i for i in range(len(words), vocab - 1)})
    words[END] = vocab - 1
    backend = Tokenizer(models.BPE(words, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=END, pad_token=END, unk_token=END)


def checkpoint(name: str, root: Path, device: str, seed: int = 0) -> Path:
    """The folder of shape `name`'s checkpoint under `root`, built on `device` the first time (bf16 weights)."""
    folder = root / f"qwen2-{name}-seed{seed}"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    shape = SHAPES[name]
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(qwen2_config(shape)).to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    byte_tokenizer(shape.vocab).save_pretrained(folder)
    del model
    return folder


def prompt_ids(count: int, vocab: int, seed: int) -> list[int]:
    """`count` random ids (never the end of turn): a prompt of known length in tokens."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (count,), generator=generator).tolist()
