"""Clock readings that mean what they say on a GPU.

CUDA runs kernels asynchronously: a forward returns once its kernels are queued, not done. A timed region
(auto gamma's cost ratio: the target's verification forward, each drafter forward) therefore waits for
every CUDA device the model uses before the clock is read, at its start and at its end. On the CPU this
costs nothing: there is nothing to wait for and no call is made.
"""

from __future__ import annotations

import time

import torch

from specchat.speculative.model_io import Model, input_device


def cuda_devices(model: Model) -> set[torch.device]:
    """The CUDA devices holding `model`'s weights: its device_map's when spread, else its embeddings'."""
    device_map: dict[str, object] = getattr(model, "hf_device_map", None) or {}
    places = set(device_map.values()) or {input_device(model)}
    return {device for device in map(_cuda_device, places) if device is not None}


def _cuda_device(place: object) -> torch.device | None:
    """A device_map value (0, "cuda:1", "cpu", "disk", a torch.device) as a CUDA device, or None."""
    if isinstance(place, int) and not isinstance(place, bool):
        return torch.device("cuda", place)
    if isinstance(place, (str, torch.device)) and str(place).startswith("cuda"):
        return torch.device(place)
    return None


def synchronize(*models: Model | None) -> None:
    """Wait for the queued work of every CUDA device the models use (none when torch sees no GPU)."""
    if not torch.cuda.is_available():
        return
    devices: set[torch.device] = set().union(*(cuda_devices(model) for model in models if model is not None))
    for device in devices:
        torch.cuda.synchronize(device)


def clock(*models: Model | None) -> float:
    """time.perf_counter() once the models' devices have finished what was queued on them."""
    synchronize(*models)
    return time.perf_counter()
