"""Memory told before it runs out: before any weights load, what the pair will hold resident (each model's weights as
its quantization keeps them, its KV cache at the context limit, the loading's largest temporary) against what this
process may use (the system's available memory, a cgroup's memory.max, RLIMIT_AS). A pair that will not fit is one
ModelLoadError line with the figures and what to change (a smaller context, a smaller quantization), not an OOM
kill half-way through the load. `runtime.memory_check = false` skips the check.

Estimated from a GGUF's header (its tensors' sizes and shapes) or a model folder's config.json and safetensors
headers; a bundled model by its parts' size alone (the bundled pair needs under 2 GB); a hub id is not estimated.
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
from dataclasses import dataclass
from pathlib import Path

from specchat.config import Config
from specchat.early_pages import held_bytes
from specchat.errors import ModelLoadError
from specchat.loading.assets import AssetError, bundled_model, find_parts
from specchat.loading.gguf.header import read_tensors
from specchat.loading.plan import ModelPlan
from specchat.memory import available_memory

GB = 1e9
RUNTIME_BYTES = int(0.5 * GB)  # torch, transformers and Python themselves, beside the weights
TEMPORARY_CAP = int(1.5 * GB)  # loading's peak over the weights: 7B Q4_K, 5.8 GB resident for a 4.3 GB file
BYTES_PER_WEIGHT = {  # resident bytes a weight as each quantization keeps it (block scales included, 6-bit layers)
    "w4a8": 0.82,
    "w4a8-fast": 0.57,
    "4bit": 0.57,
    "w8a8": 1.07,
    "w8a8-fast": 1.07,
    "int8": 1.07,
    "8bit": 1.07,
}
KV_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
CONTEXT_STEP = 1024  # a context limit suggested in a refusal is a multiple of this


@dataclass(frozen=True)
class ModelNeed:
    """What one model will hold: its weights, its KV cache's bytes a token, the loading's largest temporary."""

    label: str
    weights: int
    kv_per_token: int
    context: int  # the model's own context length (0: unknown)
    temporary: int  # one tensor as float32 while it is quantized


def model_need(plan: ModelPlan, kv_cache: str) -> ModelNeed | None:
    """The plan's model's need, from its file's header; None where the source cannot be read before loading."""
    if plan.source.kind == "gguf":
        return _gguf_need(plan, Path(plan.source.location), kv_cache)
    if plan.source.kind == "dir" and (Path(plan.source.location) / "config.json").is_file():
        return _folder_need(plan, Path(plan.source.location), kv_cache)
    if plan.source.kind == "bundled":
        return _bundled_need(plan)
    return None


def _bundled_need(plan: ModelPlan) -> ModelNeed | None:
    """A bundled model's weights as its parts' bytes (a GGUF split in pieces; its KV cache is not counted)."""
    try:
        parts = find_parts(bundled_model(plan.source.location))
    except AssetError:
        return None  # loading says what is missing, in its own words
    return ModelNeed(plan.label, sum(part.stat().st_size for part in parts), 0, 0, 0)


def _kept_bytes(plan: ModelPlan, params: int, stored: int) -> int:
    """Resident bytes of `params` weights stored in `stored` bytes, as the plan's quantization keeps them."""
    per_weight = BYTES_PER_WEIGHT.get(plan.quantization)
    if per_weight is None:  # unquantized: dequantized into the plan's dtype
        return params * plan.dtype.itemsize
    return min(stored, int(params * per_weight)) if stored else int(params * per_weight)


def _gguf_need(plan: ModelPlan, path: Path, kv_cache: str) -> ModelNeed:
    facts, tensors = read_tensors(path)
    weights = temporary = kv_width = 0
    for tensor in tensors:
        params = math.prod(tensor.shape)
        weights += _kept_bytes(plan, params, tensor.nbytes)
        temporary = max(temporary, min(params * 4, TEMPORARY_CAP))
        if tensor.name.endswith((".attn_k.weight", ".attn_v.weight")) and len(tensor.shape) == 2:
            kv_width += tensor.shape[1]  # ggml order: [inputs, outputs]; the outputs are heads × head size
    architecture = facts.get("general.architecture", "")
    context = int(facts.get(f"{architecture}.context_length", 0) or 0)
    return ModelNeed(plan.label, weights, kv_width * KV_BYTES[kv_cache], context, temporary)


def _folder_need(plan: ModelPlan, folder: Path, kv_cache: str) -> ModelNeed:
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    heads = int(config.get("num_attention_heads", 1))
    head_size = int(config.get("head_dim") or config.get("hidden_size", 0) // max(1, heads))
    kv_heads = int(config.get("num_key_value_heads", heads))
    layers = int(config.get("num_hidden_layers", 0))
    params, stored, largest = _safetensors_params(folder)
    temporary = min(largest * 4, TEMPORARY_CAP)
    kv_per_token = 2 * layers * kv_heads * head_size * KV_BYTES[kv_cache]
    context = int(config.get("max_position_embeddings", 0) or 0)
    return ModelNeed(plan.label, _kept_bytes(plan, params, stored), kv_per_token, context, temporary)


def _safetensors_params(folder: Path) -> tuple[int, int, int]:
    """(weights, their stored bytes, the largest tensor's weights) of a folder's safetensors files, from their
    headers."""
    params = stored = largest = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(min(length, 100_000_000)))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(entry["shape"])
            params += count
            stored += entry["data_offsets"][1] - entry["data_offsets"][0]
            largest = max(largest, count)
    return params, stored, largest


def available_bytes() -> tuple[int, str]:
    """What this process may still take, and what sets it: the memory the system has available, a cgroup's
    memory.max less what the cgroup holds, or RLIMIT_AS less what the process has mapped: the least of them."""
    limits = [(available_memory(), "memory available")]
    cgroup = _cgroup_room()
    if cgroup is not None:
        limits.append((cgroup, "the cgroup's memory.max"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft - _mapped_bytes(), "the process's RLIMIT_AS"))
    return min((room, why) for room, why in limits if room is not None)


def _cgroup_room() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        held = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - held


def _mapped_bytes() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_memory(plans: list[ModelPlan], cfg: Config, available: tuple[int, str] | None = None) -> None:
    """ModelLoadError (one line: the figures, what to change) where the planned pair will not fit in memory."""
    if not cfg.runtime.memory_check or any(plan.device != "cpu" for plan in plans):
        return
    needs = [need for need in (model_need(plan, cfg.runtime.kv_cache) for plan in plans) if need is not None]
    if not needs:
        return
    # pages faulted in ahead for this pair's tiles (early_pages.py), counted in its weights: read before the memory
    # available, so a page faulted in between the two readings is counted in neither, never in both
    held = held_bytes()
    room, why = available or available_bytes()
    room += held
    target = needs[0] if needs[0].label.startswith("target") else needs[-1]
    context = cfg.ui.context_limit or target.context
    fixed = sum(need.weights for need in needs) + max(need.temporary for need in needs) + RUNTIME_BYTES
    per_token = sum(need.kv_per_token for need in needs)
    if fixed + per_token * context <= room:
        return
    parts = ", ".join(f"{need.label} weights {need.weights / GB:.1f} GB" for need in needs)
    fits = (room - fixed) // per_token // CONTEXT_STEP * CONTEXT_STEP if per_token and room > fixed else 0
    advice = f"set ui.context_limit={fits} or less, or " if fits >= CONTEXT_STEP and fits < context else ""
    raise ModelLoadError(
        f"the pair needs about {(fixed + per_token * context) / GB:.1f} GB ({parts}, KV at {context:,} tokens "
        f"{per_token * context / GB:.1f} GB, loading and runtime {(fixed - sum(n.weights for n in needs)) / GB:.1f} "
        f"GB) and {why} is {room / GB:.1f} GB: {advice}load a smaller quantization of the target "
        f"(runtime.memory_check=false loads it anyway)"
    )
