"""Gemma-3 GGUF files: the rope scaling of the global layers, which transformers' GGUF reader leaves out.

Gemma-3 4B, 12B and 27B scale their global layers' rotary positions linearly (factor 8); llama.cpp's converter writes
it as `gemma3.rope.scaling.type` = linear and `gemma3.rope.scaling.factor`, and applies it to the global layers only
(the local ones keep their own base, unscaled). transformers' reader maps neither key, so the model would rotate its
global layers unscaled and answer unlike the original; the config's full_attention rope parameters get them here.
"""

from __future__ import annotations


def set_gemma_parameters(config, facts: dict) -> None:
    """config's global-layer rope made linear with the file's factor, where a gemma3 file states one."""
    architecture = facts.get("general.architecture", "")
    if architecture != "gemma3":
        return
    kind, factor = facts.get(f"{architecture}.rope.scaling.type"), facts.get(f"{architecture}.rope.scaling.factor")
    if kind != "linear" or factor is None or float(factor) == 1.0:
        return
    text = config.get_text_config()
    parameters = dict(getattr(text, "rope_parameters", None) or {})
    full = dict(parameters.get("full_attention") or {"rope_type": "default"})
    parameters["full_attention"] = {**full, "rope_type": "linear", "factor": float(factor)}
    text.rope_parameters = parameters
