"""Weights that are not numbers are refused at load, in one line: a NaN or an infinity in a file's weights (or a
value no trained weight comes near) would otherwise reach the quantizers, whose float16 scales turn it into a
traceback or into a model that writes one token over and over."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specchat.errors import ModelLoadError

WEIGHT_LIMIT = 1e6  # no trained model's weight comes near; w4a8's blocks hold at most about 2.5e8


def check_weight(owner: str, name: str, values: torch.Tensor) -> None:
    """ModelLoadError naming `owner` (a model or a file) and the weight where `values` holds NaN, an infinity, or a
    magnitude past WEIGHT_LIMIT. One pass, no copy (aminmax); meta and integer tensors are passed over."""
    if values.is_meta or not values.is_floating_point() or values.numel() == 0:
        return
    low, high = torch.aminmax(values.detach())
    largest = max(-float(low), float(high))
    if largest != largest or largest == float("inf"):  # NaN anywhere makes aminmax NaN
        raise ModelLoadError(f"{owner}: its weight {name} holds NaN or infinite values; the file is damaged")
    if largest > WEIGHT_LIMIT:
        raise ModelLoadError(
            f"{owner}: its weight {name} holds a value of {largest:.3g}, far past any trained weight "
            f"(±{WEIGHT_LIMIT:g}); the file is damaged"
        )


def check_weights(owner: str, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    for name, values in named:
        check_weight(owner, name, values)
