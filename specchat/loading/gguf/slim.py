"""A GGUF model for the w4a8 modes with no float copy of the weights the kernel runs.

The slim checkpoint in the cache holds the config, the tokenizer, and only the tensors that stay float in
the chat: norms, biases, and layers the kernel cannot take. The input embeddings stay in the file's blocks
(quant/block_embedding.py). The quantized layers come from the stored weights, built from the GGUF a
tensor at a time (gguf/blocks.py, streamed_blocks) when it has no copy.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from specchat.errors import ModelLoadError
from specchat.loading.gguf.header import Header
from specchat.loading.gguf.tensors import GGUFTensors
from specchat.quant.block_embedding import BlockEmbedding
from specchat.quant.shared import name_of
from specchat.quant.w4a8 import fitting_linears

WEIGHTS = "model.safetensors"
BLOCKS = ".gguf_blocks"  # suffix of the embeddings' stored blocks in WEIGHTS
FLOAT_KINDS = ("F32", "F16", "BF16")  # tables already in floats: stored as floats


def empty_model(config) -> nn.Module:
    """The model of `config`, its parameters on the meta device (no memory), its buffers real (rotary tables)."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def quantized_weights(model: nn.Module) -> set[str]:
    """The weights the w4a8 kernel takes: every nn.Linear whose shape fits it."""
    return {f"{name}.weight" for name in fitting_linears(model)}


def write_weights(gguf: Path, config, out: Path, header: Header | None = None) -> None:
    """WEIGHTS in `out`: the float tensors the chat keeps, and the input embeddings as the file's blocks
    (header: read_tensors' of `gguf`, where the caller has read it already)."""
    model = empty_model(config)
    tensors = GGUFTensors(gguf, model, header)
    skipped = quantized_weights(model)
    embed = name_of(model, model.get_input_embeddings())
    kind = tensors.kind(f"{embed}.weight")
    float_head = any(head not in skipped for head in tensors.tied)  # a tied head the kernel cannot take reads it
    as_blocks = kind not in FLOAT_KINDS and tensors.unchanged(f"{embed}.weight") and not float_head
    state = {}
    for name in _parameter_names(model):
        if name in skipped or name not in tensors:
            continue
        if as_blocks and name == f"{embed}.weight":
            state[embed + BLOCKS] = tensors.raw(name)
        else:
            state[name] = tensors.float(name).reshape(model.get_parameter(name).shape).contiguous()
    metadata = {"format": "pt", "embedding": embed if as_blocks else "", "embedding_kind": kind}
    save_file(state, str(out / WEIGHTS), metadata=metadata)


def _parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters(remove_duplicate=False)]


def load(directory: Path) -> nn.Module:
    """The model of a slim checkpoint: float tensors loaded, embeddings in blocks, the quantized layers'
    weights still on the meta device (the stored weights replace those layers)."""
    model = empty_model(AutoConfig.from_pretrained(directory, local_files_only=True))
    with safe_open(str(directory / WEIGHTS), framework="pt") as weights:
        metadata = weights.metadata() or {}
        state = {key: weights.get_tensor(key) for key in weights.keys()}
    embed = metadata.get("embedding", "")
    if embed:
        blocks = state.pop(embed + BLOCKS)
        model.set_input_embeddings(
            BlockEmbedding(blocks, metadata["embedding_kind"], model.config.get_text_config().hidden_size)
        )
    model.load_state_dict(state, strict=False, assign=True)
    model.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    return model


def check_materialized(model: nn.Module, label: str) -> None:
    """Every tensor of a loaded model is real: a weight still on the meta device is a layer nothing loaded."""
    missing = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if missing:
        raise ModelLoadError(
            f"{label}: {len(missing)} weight(s) were not loaded ({missing[0]}, ...); "
            f"set quantization=none to load it from a full conversion"
        )


def parameter_count(model: nn.Module) -> int:
    """The model's parameters, an embedding table in blocks counted as its rows × width."""
    embed = model.get_input_embeddings()
    extra = embed.num_embeddings * embed.embedding_dim if isinstance(embed, BlockEmbedding) else 0
    return model.num_parameters() + extra
