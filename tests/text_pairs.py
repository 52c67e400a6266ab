"""Tokenizer pairs for the text drafter and the pair check, built offline: byte-level BPE tokenizers whose tokens
are all whole ASCII text (so a random model's output decodes without loss), the same tokenizer under another
numbering with a model renumbered to match (a drafter that speaks another tokenizer yet predicts the target's
text), a target vocabulary padded wider than its drafter's, and a small check of a sampled law."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter

import torch
from helpers import reference_probs
from tiny_models import CHATML, CORPUS, SPECIALS
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specchat.config import SamplingConfig, SpeculationConfig
from specchat.speculative.events import ReplyEnd

OTHER_CORPUS = ["Completely different words train this other tokenizer; for each line it reads, it writes."] * 30
Z = 4.5  # as tests/guarantees/test_distribution.py: a correct engine fails with probability < 1e-3


def text_tokenizer(
    corpus: list[str] = CORPUS, vocab_size: int = 300, every_byte: bool = False
) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the corpus's own characters only (every token is whole text), or `every_byte`."""
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if every_byte else []
    raw.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
        ),
    )
    return _fast(raw)


def _fast(raw: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def renumbering(size: int, seed: int = 3) -> list[int]:
    """new id of each old id: a random permutation."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()


def renumbered_tokenizer(tokenizer, new_ids: list[int]) -> PreTrainedTokenizerFast:
    """The same tokens (specials too) under other ids."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    data["model"]["vocab"] = {piece: new_ids[i] for piece, i in data["model"]["vocab"].items()}
    for added in data["added_tokens"]:
        added["id"] = new_ids[added["id"]]
    return _fast(Tokenizer.from_str(json.dumps(data)))


def renumbered_model(model, new_ids: list[int]):
    """A copy of model whose embedding and head rows follow the new ids: it predicts the same text."""
    renumbered = copy.deepcopy(model)
    old_of_new = torch.argsort(torch.tensor(new_ids))
    with torch.no_grad():
        renumbered.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight[old_of_new])
        renumbered.lm_head.weight.copy_(model.lm_head.weight[old_of_new])
    return renumbered


def padded_tokenizer(tokenizer, pads: int) -> PreTrainedTokenizerFast:
    """The tokenizer with `pads` placeholder tokens after its own, as a padded GGUF vocabulary lists them."""
    padded = copy.deepcopy(tokenizer)
    padded.add_tokens([f"[PAD{len(tokenizer) + i}]" for i in range(pads)])
    return padded


def narrowed_model(model, rows: int):
    """A copy of model whose embeddings and head keep only their first `rows` ids."""
    narrow = copy.deepcopy(model)
    narrow.resize_token_embeddings(rows)
    return narrow


# ----- a sampled law, checked (tests/guarantees/test_distribution.py explains the check) -----------------
@torch.inference_mode()
def exact_first_two(target, ids: list[int], sampling: SamplingConfig) -> dict[tuple[int, int], float]:
    joint = {}
    first = reference_probs(target(torch.tensor([ids])).logits[0, -1], sampling)
    for a, pa in first.items():
        for b, pb in reference_probs(target(torch.tensor([ids + [a]])).logits[0, -1], sampling).items():
            joint[(a, b)] = pa * pb
    return joint


def sampled_first_two(engine, ids: list[int], sampling: SamplingConfig, runs: int, gamma: int) -> tuple[Counter, int]:
    """The first two tokens of `runs` seeded replies of gamma + 1 tokens, and the drafts accepted in them."""
    counts, accepted = Counter(), 0
    for seed in range(runs):
        params = SamplingConfig(**{**sampling.__dict__, "seed": seed, "max_new_tokens": gamma + 1})
        end = list(engine.steps(ids, params, SpeculationConfig(gamma=gamma)))[-1]
        assert isinstance(end, ReplyEnd)
        counts[tuple(end.ids[:2])] += 1
        accepted += end.stats.accepted
    return counts, accepted


def worst_deviation(joint: dict, counts: Counter) -> float:
    """Largest |freq - p| in units of the allowed bound; > 1 fails; a cell outside the support is inf."""
    if set(counts) - set(joint):
        return math.inf
    runs = sum(counts.values())
    return max(
        abs(counts.get(cell, 0) / runs - p) / (Z * math.sqrt(p * (1 - p) / runs) + 1.0 / runs)
        for cell, p in joint.items()
    )
