"""Tiny random Llama models and a tiny byte-level BPE tokenizer, built offline from a config.

The tests and `python scripts/tiny_pair.py` use them: nothing is downloaded.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def reverse(lst):\n    return lst[::-1]\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "for i in range(10):\n    print(i * i)\n",
    "Hello, how are you today? I am fine, thank you.",
] * 20


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def build_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 64, spread: float = 0.2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=spread,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval().to(torch.float32)
