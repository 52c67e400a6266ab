"""transformers' config of a GGUF file, completed from the file's own metadata where transformers' GGUF reader
leaves a value out.

transformers maps each architecture's GGUF keys onto its config by a table, and takes its config class's defaults
for the rest. qwen3's table has no head size, so a Qwen3 file whose head size is not Qwen3Config's default (128)
builds a model its tensors do not fit; llama.cpp writes every architecture's as `<architecture>.attention.key_length`.
"""

from __future__ import annotations

from pathlib import Path

from specchat.errors import ModelLoadError
from specchat.loading.gguf.header import HEAD_SIZE, read_tensors

MAX_HEAD_SIZE = 1 << 12  # far above any model's (256 for Gemma)


def file_config(gguf: Path):
    """The config transformers reads from `gguf`, with the head size the file states."""
    from transformers import AutoConfig

    from specchat.loading.hfquiet import quiet_transformers

    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    facts, _ = read_tensors(gguf)
    head_size = facts.get(f"{facts.get('general.architecture', '')}{HEAD_SIZE}")
    if head_size is not None:
        set_head_size(config, int(head_size), gguf)
    return config


def set_head_size(config, head_size: int, gguf: Path) -> None:
    """config.head_dim = head_size where the config's own head size differs (qwen3's default 128)."""
    if not 0 < head_size <= MAX_HEAD_SIZE or head_size % 2:
        raise ModelLoadError(
            f"{gguf} states a head size of {head_size}; an even number up to {MAX_HEAD_SIZE} is allowed"
        )
    text = config.get_text_config()
    own = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if own != head_size:
        text.head_dim = head_size
