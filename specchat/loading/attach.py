"""The attach stage: what runs a materialised model, and the labels the banner shows for it.

The lean forward (runtime/lean.py) when the plan asks for it and it can run the model; the w4a8 modes' compiled
layer loop too, with its keys and values stored as runtime.kv_cache says. A model the lean forward cannot run
stays on transformers' forward, with one notice line naming the slower path.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.config import W4A8_MODES
from specchat.kernels.build import q4_kernel, running_path
from specchat.loading.hfquiet import quiet_renamed_cache_argument
from specchat.loading.plan import ModelPlan
from specchat.progress import Progress, notify
from specchat.runtime.lean import attach_lean
from specchat.speculative.model_io import RUNNER
from specchat.speculative.sampling import TORCH_SAMPLER, CompiledSampler, Sampler


@dataclass(frozen=True)
class Attached:
    backend: str  # lean | lean (compiled layers) | transformers | "transformers (why the lean one could not run)"
    kernel: str  # the w4a8 kernel's code path (avx512-vnni, avx-vnni, avx2, portable); "" without it


def attach(model, plan: ModelPlan, progress: Progress | None = None) -> Attached:
    """Attach the lean forward when asked and possible (see the module's docstring)."""
    w4a8 = plan.quantization in W4A8_MODES
    if plan.backend != "lean":
        quiet_renamed_cache_argument()
        backend = plan.backend
    elif reason := attach_lean(model, q4_kernel().LeanLayers if w4a8 else None, plan.kv_cache):
        quiet_renamed_cache_argument()
        notify(progress, f"{plan.label} runs on transformers' forward, slower: {reason}")
        backend = f"transformers ({reason})"
    else:
        backend = "lean (compiled layers)" if not getattr(model, RUNNER).native_reason else "lean"
    return Attached(backend, running_path() if w4a8 else "")  # the path the kernel built above runs on


def pair_sampler(*kernels: str) -> Sampler:
    """Where a model of the pair runs on the compiled w4a8 module (its kernel path named), the pair's sampling
    probabilities and greedy rows (argmax, log-sum-exp) come from it too (one pass or two over a row); else from
    the logits in torch."""
    if not any(kernels):
        return TORCH_SAMPLER
    kernel = q4_kernel()
    return CompiledSampler(kernel.top_p_probs, kernel.greedy_rows)
