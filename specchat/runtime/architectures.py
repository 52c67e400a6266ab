"""What each decoder architecture's forward needs beyond a plain Llama layer, in one table.

A Llama layer: RMSNorm (x / rms · w) before attention and before the MLP, q/k/v and o projections without
biases, the rotary embedding over the whole head (transformers' rotate_half, with whatever rope scaling the
model's own rotary module computes: Llama-3's, linear, YaRN), causal attention over every earlier token,
a SiLU-gated MLP, a final RMSNorm, and an output head that is its own tensor or the input embeddings' (tied).
Everything else an architecture adds is a NEED, named here; the lean forward (lean.py) and the compiled
layer loop (lean_native.py) each say which needs they run (LEAN_RUNS, COMPILED_RUNS), and a model whose
needs they do not all run keeps transformers' forward, with the reason in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

NEEDS = {  # need: how a line names it, the ones that change the most first
    "sliding_window": "sliding-window attention",
    "soft_capping": "soft-capping",
    "fused_projections": "fused qkv_proj and gate_up_proj",
    "partial_rotary": "rotary over part of a head",
    "norm_offset": "1 + w norms",
    "sandwich_norms": "norms after attention and MLP",
    "gelu_tanh": "a GELU-tanh MLP",
    "embedding_scale": "scaled embeddings",
    "attention_scale": "its own attention scale",
    "qk_norm": "q/k norms per head",
    "qkv_bias": "q/k/v biases",
}
NAMED = 3  # needs a line names; the rest it counts


@dataclass(frozen=True)
class Architecture:
    """A transformers model type (config.model_type) and the NEEDS every model of it has; needs a config may
    or may not have (a window, biases, partial rotary) are read from the config itself (model_needs)."""

    model_type: str
    needs: frozenset[str] = frozenset()


def _arch(model_type: str, *needs: str) -> Architecture:
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"unknown architecture needs: {sorted(unknown)}")
    return Architecture(model_type, frozenset(needs))


GEMMA = ("norm_offset", "gelu_tanh", "sandwich_norms", "embedding_scale", "attention_scale")
ARCHITECTURES = {
    a.model_type: a
    for a in (
        _arch("llama"),  # Llama 2/3 (3.2: tied head), and the many files written as llama
        _arch("mistral"),  # a llama-architecture file whose name says Mistral
        _arch("qwen2", "qkv_bias"),
        _arch("qwen3", "qk_norm"),  # its head size need not be hidden ÷ heads
        _arch("phi3", "fused_projections"),
        _arch("gemma2", *GEMMA, "soft_capping"),
        _arch("gemma3_text", *GEMMA, "qk_norm"),
    )
}

# runtime/lean.py's Python loop (partial_rotary there only); fused_projections (Phi-3): runtime/fused.py, in both
LEAN_RUNS = frozenset(
    {"qkv_bias", "qk_norm", "fused_projections", "partial_rotary", "sliding_window", "soft_capping", *GEMMA}
)
COMPILED_RUNS = frozenset(  # kernels/lean_layers.cpp via lean_native.py
    {"qkv_bias", "qk_norm", "fused_projections", "sliding_window", "soft_capping", *GEMMA}
)


def model_needs(config) -> frozenset[str] | None:
    """The NEEDS of a model of this (text) config; None where its model type is not in the table."""
    config = config.get_text_config()
    known = ARCHITECTURES.get(getattr(config, "model_type", ""))
    if known is None:
        return None
    needs = set(known.needs)
    if getattr(config, "attention_bias", False):
        needs.add("qkv_bias")
    if _has_window(config):
        needs.add("sliding_window")
    if _rotary_fraction(config) < 1.0:
        needs.add("partial_rotary")
    return frozenset(needs)


def unsupported(config, runs: frozenset[str], runner: str, name: str = "") -> str:
    """'' when `runner` (what the line calls the forward) runs every need of this config's model, else why not;
    name: what the line calls the model (its class), else its model type."""
    needs = model_needs(config)
    name = name or getattr(config.get_text_config(), "model_type", "?")
    if needs is None:
        return f"{name} is not in {runner}'s architecture table ({', '.join(ARCHITECTURES)})"
    missing = [NEEDS[need] for need in NEEDS if need in needs - runs]
    if missing:
        more = f" and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
        return f"{name} needs {', '.join(missing[:NAMED])}{more}, which {runner} lacks"
    return ""


def _has_window(config) -> bool:
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    if getattr(config, "use_sliding_window", None) is False:  # qwen2/qwen3: a window only where this is on
        return False
    return getattr(config, "sliding_window", None) is not None


def _rotary_fraction(config) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    fraction = parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return 1.0 if fraction is None else float(fraction)
