"""Each model's quantization, settled for this machine before any slow work (assembly, conversion,
loading): a mode whose kernel cannot be had here fails in seconds, not after minutes of conversion.

`auto` (`auto-fast`, the drafter's) is the default config's choice: w4a8 (w4a8-fast) on a CPU where
specchat's kernel builds; else w8a8 (w8a8-fast), exact too, where torch has its x86 int8 kernels; else
none. A fallback says what it chose and why in one notice line. Off the CPU, auto loads unquantized.
A mode named explicitly that cannot run here raises ModelLoadError naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses

import torch

from specchat.config import AUTO_MODES, INVARIANT_MODES, QUANTIZATIONS, W4A8_MODES, Config, ModelConfig
from specchat.errors import ModelLoadError
from specchat.kernels.build import kernel_problem
from specchat.loading.devices import resolve_device
from specchat.progress import Progress, notify


def choose_quantizations(cfg: Config, progress: Progress | None = None) -> Config:
    """cfg with the target's and the drafter's quantization settled (see the module's docstring)."""
    for role in ("target", "drafter"):
        mc: ModelConfig = getattr(cfg, role)
        if mc.source:
            cfg = dataclasses.replace(cfg, **{role: choose(mc, role, cfg.runtime.kernel, progress)})
    return cfg


def settle(
    mc: ModelConfig, role: str, device: str, kernel_path: str = "auto", progress: Progress | None = None
) -> ModelConfig:
    """One model's quantization as it will run on `device` (resolved): chosen (choose), then made runnable there
    (runnable_quantization)."""
    return runnable_quantization(choose(mc, role, kernel_path, progress, device), device, role, progress)


def choose(
    mc: ModelConfig, role: str, kernel_path: str = "auto", progress: Progress | None = None, device: str = ""
) -> ModelConfig:
    """One model's settled ModelConfig: auto resolved, and a w4a8 mode checked to run here. `device`: mc.device
    resolved, where the caller has it."""
    if mc.quantization not in (*W4A8_MODES, *AUTO_MODES):
        return mc
    if torch.device(device or resolve_device(mc.device)).type != "cpu":
        return dataclasses.replace(mc, quantization="none") if mc.quantization in AUTO_MODES else mc
    problem = kernel_problem("auto", progress, holding=kernel_path)  # one build, the path named in it
    if not problem and kernel_path != "auto":  # a path named for this CPU: an error, never a fallback
        unavailable = kernel_problem(kernel_path)
        if unavailable:
            raise ModelLoadError(f"{unavailable}; use runtime.kernel=auto")
    if mc.quantization in W4A8_MODES:
        if problem:
            allowed = ", ".join(q for q in QUANTIZATIONS if q not in W4A8_MODES)
            raise ModelLoadError(
                f'{role}.quantization = "{mc.quantization}" needs specchat\'s w4a8 kernel, which is '
                f"not available here: {problem}; choose one of {allowed}"
            )
        return mc
    kernel_mode, int8_mode = AUTO_MODES[mc.quantization]
    if not problem:
        return dataclasses.replace(mc, quantization=kernel_mode)
    fallback = int8_mode if has_x86_int8() else "none"
    notify(
        progress,
        f"{role}: using quantization {fallback}, not {kernel_mode}: the w4a8 kernel is not available "
        f"here ({problem}); set {role}.quantization to choose another",
    )
    return dataclasses.replace(mc, quantization=fallback)


def has_x86_int8() -> bool:
    """Whether torch has its x86 int8 kernels (fbgemm), which w8a8 runs on."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def runnable_quantization(mc: ModelConfig, device: str, role: str, progress: Progress | None = None) -> ModelConfig:
    """specchat's own int8 modes are for the CPU: elsewhere the model loads unquantized, with one notice.

    w8a8 runs on fbgemm, a CPU kernel; w4a8 on specchat's own AVX2 kernel. Weight-only int8 runs on a
    GPU too, but dequantizes every weight on every call there, which is slower than the 16-bit weights
    it replaces (use 4bit or 8bit there)."""
    if mc.quantization not in ("int8", *INVARIANT_MODES) or torch.device(device).type == "cpu":
        return mc
    why = (
        "is fast on the CPU only (elsewhere it dequantizes every weight on every call)"
        if mc.quantization == "int8"
        else "runs on the CPU only"
    )
    notify(progress, f"{role}: quantization {mc.quantization} {why}; loading it unquantized on {device}")
    return dataclasses.replace(mc, quantization="none")
