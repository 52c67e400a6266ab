"""The last materialise step: specchat's own quantization of loaded weights, stored once quantized.

Weight-only int8, or int8×int8 / 4-bit×int8 with batch-invariant attention (stored_weights.py keeps the blocks).
bitsandbytes' 4bit and 8bit are from_pretrained's business (devices.quantization_config): nothing is done here.
A slim checkpoint's quantized layers are filled here, and then checked whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specchat.config import INVARIANT_MODES, W4A8_MODES
from specchat.kernels.build import q4_kernel
from specchat.loading import assets, stored_weights
from specchat.loading.checkpoint import Checkpoint
from specchat.loading.devices import dtype_name
from specchat.loading.finite import check_weights
from specchat.loading.gguf.slim import check_materialized
from specchat.loading.plan import ModelPlan
from specchat.progress import Progress, notify
from specchat.runtime.attention import use_batch_invariant_attention

OWN_MODES = ("int8", *INVARIANT_MODES)  # the modes quantized here, after loading


@dataclass
class Quantized:
    """The model as it runs, and the dtype it computes in (float32 in the int8×int8 and 4-bit×int8 modes)."""

    model: Any
    dtype: torch.dtype
    label: str  # the banner's quantization: none | 4bit | 8bit | int8 | w8a8 | the GGUF's type, e.g. Q4_K_M(→int8)


def quantize(model, checkpoint: Checkpoint, plan: ModelPlan, progress: Progress | None = None) -> Quantized:
    """The model quantized as the plan says (in place: from its stored weights when they are there)."""
    dtype, label = plan.dtype, quantization_label(checkpoint.quantization, plan.quantization)
    check_weights(plan.label, model.named_parameters())  # before any quantizer sees a NaN
    if plan.quantization in OWN_MODES:
        notices = quantize_with_stored_weights(model, checkpoint, plan, progress)
        for notice in notices:
            notify(progress, notice)
    if plan.quantization in INVARIANT_MODES:
        use_batch_invariant_attention(model)
    if checkpoint.slim:  # every layer filled by now; the assembled file of a bundled model is needed no more
        check_materialized(model, plan.label)
        if plan.source.kind == "bundled":
            assets.drop_assembled(plan.source.location)
    if plan.quantization in INVARIANT_MODES:  # the int8 kernels return float32: norms and attention stay in it
        model, dtype = model.float(), torch.float32
    return Quantized(model, dtype, label)


def quantize_with_stored_weights(
    model, checkpoint: Checkpoint, plan: ModelPlan, progress: Progress | None
) -> list[str]:
    """Quantize in one of OWN_MODES through stored_weights.py; the notice lines to show (damaged stored weights
    rebuilt, layers left unquantized)."""
    mode = plan.quantization
    if mode in W4A8_MODES:  # compiled before the weights are quantized, so its wait is said first
        q4_kernel(progress)
    path = stored_weights.stored_weights_path(checkpoint.identity, dtype_name(plan.dtype), mode)
    # a user's GGUF stays where it is; a bundled model's is assembled for its first start, then let go
    file_stays = checkpoint.gguf is not None and plan.source.kind != "bundled"
    rebuilt = stored_weights.load_or_quantize(
        model, path, plan.label, mode, progress, gguf=checkpoint.gguf, file_stays=file_stays
    )
    unfit = stored_weights.unquantized_layers(model, mode)
    notices = [rebuilt] if rebuilt else []
    if unfit:
        notices.append(
            f"{plan.label}: {len(unfit)} linear layer(s) stay unquantized ({unfit[0]}, ...): "
            f"{mode} takes input widths that are multiples of 64"
        )
    return notices


def quantization_label(checkpoint_quant: str, mode: str) -> str:
    """What the banner calls the model's quantization: the checkpoint's own (a GGUF type), the mode, or both."""
    if mode == "none":
        return checkpoint_quant
    return mode if checkpoint_quant == "none" else f"{checkpoint_quant}→{mode}"
