"""Tiny random models and a tiny byte-level BPE tokenizer, built offline from a config."""
from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specchat.drafters import ModelDrafter
from specchat.engine import Engine

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
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def build_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 64,
                spread: float = 0.2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, initializer_range=spread,
                         tie_word_embeddings=False, pad_token_id=0)
    return LlamaForCausalLM(config).eval().to(torch.float32)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def target(tokenizer):
    return build_model(len(tokenizer), seed=1, layers=3)


@pytest.fixture(scope="session")
def unrelated_drafter_model(tokenizer):
    return build_model(len(tokenizer), seed=2, layers=1, hidden=32)


@pytest.fixture(scope="session")
def similar_drafter_model(target):
    """The target with a noisy output head: agrees often, not always (mixed accept/reject steps)."""
    drafter = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        head = drafter.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * head.std() * 0.6)
    return drafter


@pytest.fixture(scope="session")
def int8_drafter_model(similar_drafter_model):
    """The similar drafter with weight-only int8 layers (its q differs a little from the float one)."""
    from specchat.int8_weights import quantize_linears
    drafter = copy.deepcopy(similar_drafter_model)
    quantize_linears(drafter)
    return drafter


def make_engine(target, drafter_model, tokenizer, eos_ids=()) -> Engine:
    drafter = ModelDrafter(drafter_model, len(tokenizer)) if drafter_model is not None else None
    return Engine(target, tokenizer, drafter, eos_ids=eos_ids)


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)
