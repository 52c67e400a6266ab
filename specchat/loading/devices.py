"""Devices, dtypes and the from_pretrained arguments that place and quantize a model."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BitsAndBytesConfig

from specchat.config import DTYPES, INVARIANT_MODES, ModelConfig
from specchat.errors import ModelLoadError

CPUINFO = Path("/proc/cpuinfo")
FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def resolve_device(device: str) -> str:
    """auto -> cuda when torch sees a GPU, else Apple's mps when torch has it, else cpu; an explicit
    GPU must exist."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device} was asked for, but torch sees no CUDA GPU; use device=cpu or device=auto"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device} does not exist; this machine has {torch.cuda.device_count()} CUDA GPU(s)"
            )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device mps was asked for, but torch has no MPS backend here; use device=cpu")
    return device


def cpu_has_fast_bf16(cpuinfo: Path | None = None) -> bool:
    """True when the CPU has native bf16 arithmetic (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    cpuinfo = cpuinfo or CPUINFO
    if not cpuinfo.exists():
        return False
    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return any(flag in flags for flag in FAST_BF16_FLAGS)


def cuda_computes_bf16(device: str) -> bool:
    """Native bf16 on that GPU (compute capability 8.0 on: Ampere and later). T4 and V100 only emulate
    it, slowly, though torch.cuda.is_bf16_supported() says yes there, and asks the current device only."""
    index = torch.device(device).index
    major, _minor = torch.cuda.get_device_capability(0 if index is None else index)
    return major >= 8


def check_device_types(target_device: str, drafter_device: str) -> None:
    """Both models on one device type: one seeded sampling generator serves both (a CUDA generator
    cannot sample a CPU drafter's tokens)."""
    target_type, drafter_type = torch.device(target_device).type, torch.device(drafter_device).type
    if target_type != drafter_type:
        raise ModelLoadError(
            f"the target is on {target_device} and the drafter on {drafter_device}: put both on "
            f"the same kind of device (target.device / drafter.device), e.g. both cuda"
        )


def resolve_dtype(dtype: str, device: str, quantization: str = "none") -> torch.dtype:
    """auto -> bf16 where the device computes it fast, else float16 on GPUs and float32 on CPUs; bitsandbytes
    8-bit on a GPU gets float16, the activations its int8 kernel reads (see quantization_config)."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        return getattr(torch, dtype)  # config.DTYPES names torch dtypes: float32, bfloat16, float16
    if device.startswith("cuda"):
        if quantization == "8bit":
            return torch.float16
        return torch.bfloat16 if cuda_computes_bf16(device) else torch.float16
    if device == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


LLM_INT8_THRESHOLD = 6.0  # bitsandbytes' default: activations above it go through the fp16 outlier path


def quantization_config(quantization: str, compute_dtype: torch.dtype, device: str = "cpu"):
    """A BitsAndBytesConfig for 4bit (nf4, double quant) or 8bit; None for none, int8 and w8a8
    (specchat's own int8 layers, applied after loading: see int8_weights.py and w8a8.py).

    8bit trades quality against batch invariance, differently on each device:
    - on a GPU, LLM.int8 with its fp16 outlier decomposition (llm_int8_threshold 6). Models from about
      6.7B parameters up have a few activation columns far larger than the rest; quantized with them, every
      other column loses its precision, and quality falls apart (Dettmers et al. 2022). The price: the
      outlier columns are picked from the whole batch, so a (gamma+1)-token verification forward can score
      a token a little differently from a one-token forward, and greedy speculative output can then differ
      from target-only output at a near tie (GPU matmuls are not batch-invariant in general anyway). The
      rejection rule stays exact for the logits the target computed.
    - on the CPU (small models), row-wise int8 without the decomposition (llm_int8_threshold 0): batch-invariant,
      so greedy speculative output equals target-only output.
    The int8 kernel reads float16 activations and casts others on every call, logging a warning each time:
    dtype auto is float16 for 8bit on a GPU (resolve_dtype), and that warning is silenced (hfquiet.py) for
    an explicit bfloat16, whose cast is the user's choice. float16 activations can overflow in some models
    trained in bf16 (gemma); such a model wants 4bit, or dtype = "bfloat16" with the cast.
    """
    if quantization in ("none", "int8", *INVARIANT_MODES):
        return None
    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    threshold = LLM_INT8_THRESHOLD if torch.device(device).type == "cuda" else 0.0
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=threshold)


def max_memory_map(max_memory: dict) -> dict:
    """TOML keys are strings: "0" -> GPU 0, "cpu"/"disk" stay; values are "20GiB" or bytes."""
    mapped = {}
    for key, value in max_memory.items():
        key = str(key)
        if not (key.isdigit() or key in ("cpu", "disk")):
            raise ModelLoadError(f"max_memory key {key!r} must be a GPU index (0, 1, ...), cpu or disk")
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ModelLoadError(f'max_memory[{key}] must be a size such as "20GiB" or a byte count, got {value!r}')
        mapped[int(key) if key.isdigit() else key] = value
    return mapped


def placement_kwargs(mc: ModelConfig, role: str, device: str, dtype: torch.dtype) -> dict:
    """from_pretrained arguments for dtype, device placement and bitsandbytes quantization."""
    kwargs: dict = {"dtype": dtype}
    if mc.device_map == "auto":
        if role != "target":
            raise ModelLoadError(
                f"{role}.device_map must be empty: only the target may be spread "
                f"over several GPUs, the {role} stays on one device"
            )
        kwargs["device_map"] = "auto"
        if mc.max_memory:
            kwargs["max_memory"] = max_memory_map(mc.max_memory)
    else:
        if mc.max_memory:
            raise ModelLoadError(f'{role}.max_memory needs {role}.device_map = "auto"')
        kwargs["device_map"] = {"": device}
    bnb = quantization_config(mc.quantization, dtype, device)
    if bnb is not None:
        kwargs["quantization_config"] = bnb
    return kwargs
