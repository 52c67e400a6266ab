"""transformers' config of a GGUF file, completed from the file's own metadata where transformers' GGUF reader
leaves a value out.

transformers maps each architecture's GGUF keys onto its config by a table, and takes its config class's defaults
for the rest. qwen3's table has no head size, so a Qwen3 file whose head size is not Qwen3Config's default (128)
builds a model its tensors do not fit; llama.cpp writes every architecture's as `<architecture>.attention.key_length`.

Llama-3.1+ files hold their rope scaling as a tensor, `rope_freqs.weight` (one divisor per rotary frequency), which
transformers' reader ignores: the model would rotate as plain Llama and answer unlike llama.cpp (and the original
model). The divisors are matched against Llama-3's scaling (rope_type "llama3") and the config says it; divisors
no such scaling gives are one notice line, and the model runs without them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from transformers import AutoConfig

from specchat.errors import ModelLoadError
from specchat.loading.gguf.gemma import set_gemma_parameters
from specchat.loading.gguf.header import HEAD_SIZE, Header, read_tensors
from specchat.loading.gguf.phi3 import set_phi3_parameters
from specchat.loading.hfquiet import quiet_transformers
from specchat.progress import Progress, report

MAX_HEAD_SIZE = 1 << 12  # far above any model's (256 for Gemma)
ROPE_FREQS = "rope_freqs.weight"
LLAMA3_BANDS = (1.0, 4.0)  # low_freq_factor, high_freq_factor of every Llama-3.x release
LLAMA3_CONTEXTS = (8192, 4096, 2048, 16384, 32768, 65536, 131072)  # original_max_position_embeddings tried
FACTOR_TOLERANCE = 1e-4  # relative: the file stores the divisors as float32


def file_config(gguf: Path, progress: Progress | None = None, header: Header | None = None):
    """The config transformers reads from `gguf`, with the head size and the rope scaling the file states
    (header: read_tensors' of `gguf`, where the caller has read it already)."""
    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    facts, tensors = header or read_tensors(gguf)
    head_size = facts.get(f"{facts.get('general.architecture', '')}{HEAD_SIZE}")
    if head_size is not None:
        set_head_size(config, int(head_size), gguf)
    divisors = next((entry.data for entry in tensors if entry.name == ROPE_FREQS), None)
    if divisors is not None:
        set_rope_divisors(config, divisors.view(np.float32).reshape(-1), gguf, progress)
    set_phi3_parameters(config, facts, tensors, gguf)  # its window, rotated part and LongRoPE
    set_gemma_parameters(config, facts)  # Gemma-3's global layers' linear rope scaling
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


def set_rope_divisors(config, divisors: np.ndarray, gguf: Path, progress: Progress | None) -> None:
    """config's rope parameters made Llama-3's scaling where it gives `divisors` (rope_freqs), else one notice."""
    text = config.get_text_config()
    parameters = dict(getattr(text, "rope_parameters", None) or {})
    dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    base = float(parameters.get("rope_theta", getattr(text, "rope_theta", 10000.0)))
    scaling = llama3_scaling(divisors, base, dim)
    if scaling is None:
        report(
            progress,
            f"{gguf.name}: its rope_freqs are not Llama-3's rope scaling; the model rotates without them "
            "(its answers will differ from llama.cpp's)",
            None,
        )
        return
    text.rope_parameters = {**parameters, "rope_theta": base, **scaling}


def llama3_scaling(divisors: np.ndarray, base: float, dim: int) -> dict | None:
    """The rope_type "llama3" parameters whose divisors are `divisors`; None where none of those tried are."""
    if divisors.shape != (dim // 2,) or not np.isfinite(divisors).all() or (divisors <= 0).any():
        return None
    factor = float(divisors.max())
    low, high = LLAMA3_BANDS
    for context in LLAMA3_CONTEXTS:
        expected = llama3_divisors(base, dim, factor, low, high, context)
        if np.allclose(expected, divisors, rtol=FACTOR_TOLERANCE, atol=0.0):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": context,
            }
    return None


def llama3_divisors(base: float, dim: int, factor: float, low: float, high: float, context: int) -> np.ndarray:
    """The divisors llama.cpp's converter writes for Llama-3's scaling (convert_hf_to_gguf.py's rope_freqs):
    1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    divisors = []
    for index in range(0, dim, 2):
        wavelength = 2 * math.pi * base ** (index / dim)
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)
