"""What a Phi-3 GGUF file states that transformers' GGUF reader leaves out of the config.

transformers maps a phi3 file's context length, widths, heads and rope base, and nothing else. llama.cpp's converter
also writes (convert_hf_to_gguf.py, Phi3MiniModel):
- `phi3.attention.sliding_window`: the keys a row reads (Phi-3-mini-4k: 2047; 0: none, as Phi-4 writes);
- `phi3.rope.dimension_count`: the rotated part of a head (Phi-4-mini rotates 3/4 of it);
- LongRoPE (Phi-3-128k, Phi-3.5): its per-frequency factors as the tensors `rope_factors_short.weight` and
  `rope_factors_long.weight`, the original context as `phi3.rope.scaling.original_context_length`, and the cos/sin
  scale as `phi3.rope.scaling.attn_factor`.
Left out, the model would rotate without its factors (a Phi-3.5's short factors are not 1, so every answer would
differ from the original model's and from llama.cpp's) and read keys its window excludes. Here they go into the
config as the original model's config.json states them; the lean forward takes LongRoPE per position (runtime/rope.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specchat.errors import ModelLoadError

SHORT, LONG = "rope_factors_short.weight", "rope_factors_long.weight"


def set_phi3_parameters(config, facts: dict, tensors: list, gguf: Path) -> None:
    """A phi3 config completed with the file's window, rotated part and LongRoPE (facts, tensors: read_tensors')."""
    text = config.get_text_config()
    if getattr(text, "model_type", "") != "phi3":
        return
    architecture = facts.get("general.architecture", "phi3")
    window = facts.get(f"{architecture}.attention.sliding_window")
    if window is not None:
        text.sliding_window = int(window) or None
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    parameters = dict(getattr(text, "rope_parameters", None) or {})
    rotated = facts.get(f"{architecture}.rope.dimension_count")
    if rotated is not None and 0 < int(rotated) < head_dim:
        parameters["partial_rotary_factor"] = int(rotated) / head_dim
    factors = {entry.name: entry for entry in tensors if entry.name in (SHORT, LONG)}
    if factors:
        parameters.update(_longrope(facts, architecture, factors, head_dim, parameters, gguf))
        text.original_max_position_embeddings = parameters["original_max_position_embeddings"]
    text.rope_parameters = parameters


def _longrope(facts: dict, architecture: str, factors: dict, head_dim: int, parameters: dict, gguf: Path) -> dict:
    """The rope parameters of rope_type longrope the file's factors and keys state; a file that states them only in
    part is a ModelLoadError."""
    original = facts.get(f"{architecture}.rope.scaling.original_context_length")
    rotated = int(head_dim * parameters.get("partial_rotary_factor", 1.0))
    values = {name: _floats(entry) for name, entry in factors.items()}
    if len(values) != 2 or original is None or any(v.shape != (rotated // 2,) for v in values.values()):
        raise ModelLoadError(
            f"{gguf} states LongRoPE only in part: it needs {SHORT} and {LONG} of {rotated // 2} values each and "
            f"{architecture}.rope.scaling.original_context_length"
        )
    longrope = {
        "rope_type": "longrope",
        "short_factor": values[SHORT].tolist(),
        "long_factor": values[LONG].tolist(),
        "original_max_position_embeddings": int(original),
    }
    scale = facts.get(f"{architecture}.rope.scaling.attn_factor")
    if scale is not None:
        longrope["attention_factor"] = float(scale)
    return longrope


def _floats(entry) -> np.ndarray:
    """A float32 tensor's values, flat."""
    if getattr(entry.tensor_type, "name", "") != "F32":
        raise ModelLoadError(f"{entry.path}: {entry.name} is {entry.tensor_type}, not F32")
    return entry.data.view(np.float32).reshape(-1).astype(np.float64)
