"""The resolve stage: what each model of a pair will be, settled before anything slow is done.

A ModelPlan holds where the weights come from (the Source), where they run (device, dtype, from_pretrained's
placement) and in what quantization, as this machine allows: a mode whose kernel cannot be had here, a device
that does not exist, or a pair split over two kinds of device fails here, in seconds, before any assembly,
conversion or download. Nothing here reads weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specchat.config import Config, ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading.devices import check_device_types, placement_kwargs, resolve_device, resolve_dtype
from specchat.loading.gguf.header import SPECIAL_IDS, TOKEN_COUNT, read_tensors, shown
from specchat.loading.quantization_choice import settle
from specchat.loading.sources import Source, resolve_source
from specchat.progress import Progress


@dataclass(frozen=True)
class ModelPlan:
    """One model as the resolve stage settled it; the later stages read this, not the ModelConfig."""

    role: str  # target | drafter
    source: Source
    written: str  # the source as the config names it, for the banner
    device: str  # cpu | cuda | cuda:1 | mps
    dtype: torch.dtype
    quantization: str  # settled: auto resolved, a mode that cannot run on `device` replaced by none
    placement: dict = field(compare=False)  # from_pretrained's dtype, device_map, max_memory, quantization_config
    revision: str = ""
    trust_remote_code: bool = False
    backend: str = "lean"  # lean | transformers
    kv_cache: str = "float16"  # how the compiled layer loop stores keys and values (runtime.kv_cache)

    @property
    def label(self) -> str:
        """The role and the model's name, as notices name it: `target Qwen2.5-Coder-1.5B`."""
        return f"{self.role} {self.source.name}"


def plan_pair(cfg: Config, progress: Progress | None = None) -> list[ModelPlan]:
    """The target's plan and (when configured) the drafter's, in the order they load (drafter_loads_first)."""
    kernel, kv_cache, drafter_first = cfg.runtime.kernel, cfg.runtime.kv_cache, drafter_loads_first(cfg)
    target = plan_model(cfg.target, "target", kernel, kv_cache, progress)
    if not cfg.drafter.source:
        return [target]
    drafter = plan_model(cfg.drafter, "drafter", kernel, kv_cache, progress, beside=target.device)
    return [drafter, target] if drafter_first else [target, drafter]


def drafter_loads_first(cfg: Config) -> bool:
    """A target spread by device_map = "auto" fills each GPU's free memory (as accelerate measures it) up to its
    max_memory; the drafter is placed before it, so that the target's map leaves the drafter's weights room."""
    return bool(cfg.drafter.source) and cfg.target.device_map == "auto"


def plan_model(
    mc: ModelConfig,
    role: str = "target",
    kernel: str = "auto",
    kv_cache: str = "float16",
    progress: Progress | None = None,
    beside: str | None = None,
) -> ModelPlan:
    """One model's plan. `kernel`: runtime.kernel (a w4a8 code path named for this CPU); `beside`: the target's
    device, for a drafter (both must be one kind of device: one seeded sampling generator serves both)."""
    source = resolve_source(mc.source)
    if source.kind == "gguf":
        check_gguf_header(source.location, role)
    device = resolve_device(mc.device)
    if beside is not None:
        check_device_types(beside, device)
    mc = settle(mc, role, device, kernel, progress)
    dtype = resolve_dtype(mc.dtype, device, mc.quantization)
    placement = placement_kwargs(mc, role, device, dtype)
    if mc.revision and source.kind != "hub":
        raise ModelLoadError(f"revision = {mc.revision!r} only applies to hub ids, not to {mc.source}")
    return ModelPlan(
        role,
        source,
        mc.source,
        device,
        dtype,
        mc.quantization,
        placement,
        mc.revision,
        mc.trust_remote_code,
        mc.backend,
        kv_cache,
    )


def check_gguf_header(path: str, role: str) -> None:
    """Before any slow work (the other model's loading too): the GGUF is whole and well formed (its header's bounded
    read, gguf/header.py) and holds an architecture transformers reads. No chat template is needed: a drafter
    uses the target's, and a target without one chats in the plain User:/Assistant: template."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    facts, _ = read_tensors(Path(path))
    architecture = str(facts.get("general.architecture", ""))
    known = [name for name in GGUF_SUPPORTED_ARCHITECTURES if name not in ("general", "tokenizer")]
    if architecture not in known:
        raise ModelLoadError(
            f"{role} {Path(path).name}: its architecture {shown(architecture) or '(none)'!r} is not one specchat "
            f"reads from GGUF ({', '.join(known)})"
        )
    tokens = facts.get(TOKEN_COUNT)
    for key in SPECIAL_IDS:
        if tokens is not None and key in facts and facts[key] >= tokens:
            which = "BOS" if "bos" in key else "EOS"
            raise ModelLoadError(
                f"{role} {Path(path).name}: its {which} token id ({key}) is {facts[key]:,}, past its vocabulary of "
                f"{tokens:,} tokens; the file is damaged"
            )
