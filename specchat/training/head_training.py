"""Self-distilling a draft head (speculative/drafters/head.py) from the target: the target reads text, and at every
position the head learns to predict the target's next hidden state from its hidden state and the next token's
embedding, and to make the target's output head choose there what the target's own next hidden state chooses.

The target's hidden states are read with no output head (model_io.hidden_tensor): a position costs a prompt
token's reading. The loss per position: smooth L1 between the predicted and the true next hidden state, plus the
cross-entropy of the output head's rows (the drafter view's first ids) on the prediction against the token the
true state chooses (EAGLE's two terms); with --depth N, N drafts deep, each next prediction from the head's own
previous one, as it drafts. Inputs get a little uniform noise, as EAGLE's.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specchat.speculative import model_io
from specchat.speculative.drafters.head import FeatureHead

CHUNK = 512  # tokens the target reads at a time
NOISE = 0.1  # uniform noise on the input hidden states, × their RMS (EAGLE's 0.2 on raw features, here normed)
CE_WEIGHT = 0.1
DEPTH = 1  # drafts deep a chunk is learnt (train-drafter --depth): 3 measured worse in 20 minutes (draft-head.md)
TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst", ".toml", ".json", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java")
MAX_FILE_BYTES = 1_000_000


def default_sources() -> list[Path]:
    """Text on any machine with Python: the standard library's sources."""
    return [Path(sysconfig.get_paths()["stdlib"])]


def text_files(sources: Iterable[Path]) -> Iterator[Path]:
    """The text files under `sources` (files given themselves), in a stable order; hidden folders left out."""
    for source in sources:
        if source.is_file():
            yield source
            continue
        for path in sorted(source.rglob("*")):
            if any(part.startswith(".") for part in path.relative_to(source).parts):
                continue
            if path.suffix in TEXT_SUFFIXES and path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                yield path


def token_chunks(files: Iterable[Path], tokenizer, length: int = CHUNK) -> Iterator[list[int]]:
    """The files' text as token ids, cut into chunks of `length` (a file's tail shorter than 64 tokens dropped)."""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer.encode(text)
        for start in range(0, len(ids), length):
            if len(ids) - start >= 64:
                yield ids[start : start + length]


def target_states(target: model_io.Model, ids: list[int]) -> torch.Tensor:
    """The target's last hidden states (after its final norm) at every position of `ids` [n, hidden], float32 (a
    tensor autograd may read: cloned out of inference mode)."""
    with torch.inference_mode():
        cache = model_io.new_kv_cache(target)
        tensor = torch.tensor([ids], dtype=torch.long, device=model_io.input_device(target))
        states = model_io.hidden_tensor(target, cache, tensor, keep=len(ids)).float()
    return states.clone()


def output_rows(output: nn.Module, rows: int) -> torch.Tensor:
    """The output head's first `rows` rows as float32 [rows, hidden] (a 4-bit head dequantized)."""
    with torch.inference_mode():
        if getattr(output, "tiles", None) is not None:
            weights = output.rows(slice(0, rows)).tiles.dequantize().float()[:rows]
        else:
            weights = output.weight[:rows].float()
    return weights.clone()


@dataclass
class Batch:
    """One chunk as the head learns from it: the inputs (hidden state, next token's embedding) and the targets."""

    states: torch.Tensor  # [n-1, hidden]: the target's at positions 0 .. n-2
    embedded: torch.Tensor  # [n-1, hidden]: the embeddings of tokens 1 .. n-1
    next_states: torch.Tensor  # [n-1, hidden]: the target's at positions 1 .. n-1
    chosen: torch.Tensor  # [n-1]: what the output rows choose from next_states


def batch(states: torch.Tensor, ids: list[int], embed: nn.Module, rows: torch.Tensor) -> Batch:
    with torch.inference_mode():
        tokens = torch.tensor(ids[1:], dtype=torch.long, device=states.device)
        embedded = embed(tokens).float().reshape(len(ids) - 1, -1)
    embedded, next_states = embedded.clone(), states[1:]
    with torch.no_grad():
        chosen = (next_states @ rows.T).argmax(-1)
    return Batch(states[:-1], embedded, next_states, chosen)


def train_on(
    head: FeatureHead, optimizer: torch.optim.Optimizer, data: Batch, rows: torch.Tensor, depth: int = DEPTH
) -> float:
    """One optimizer step on one chunk, `depth` drafts deep: the first from the target's (noisy) states, each next
    from the head's own prediction before it, as it drafts (EAGLE-3's training-time test). Its loss."""
    scale = data.states.pow(2).mean().sqrt()
    predicted = data.states + (torch.rand_like(data.states) - 0.5) * 2 * NOISE * scale
    loss = torch.zeros(())
    for draft in range(min(depth, data.states.shape[0])):
        predicted = head(predicted if draft == 0 else predicted[:-1], data.embedded[draft:])
        step = nn.functional.smooth_l1_loss(predicted, data.next_states[draft:])
        loss = loss + step + CE_WEIGHT * nn.functional.cross_entropy(predicted @ rows.T, data.chosen[draft:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.inference_mode()
def agreement(head: FeatureHead, data: Batch, rows: torch.Tensor) -> tuple[int, int]:
    """(positions where the output rows choose from the head's prediction what they choose from the target's own
    next state, positions): the greedy acceptance of a first draft."""
    predicted = head(data.states, data.embedded)
    return int(((predicted @ rows.T).argmax(-1) == data.chosen).sum()), int(data.chosen.shape[0])
