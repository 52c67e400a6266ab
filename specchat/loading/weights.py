"""The second materialise step: a checkpoint's weights, read by transformers (or gguf/slim.py for a slim one).

Every failure inside transformers becomes one ModelLoadError line (sources.load_failure). The tokenizer is read
apart (shared_tokenizer.py): a pair whose two checkpoints hold the same tokenizer files reads them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

from specchat.errors import ModelLoadError
from specchat.loading.checkpoint import Checkpoint
from specchat.loading.gguf.slim import load as load_slim
from specchat.loading.gguf.slim import parameter_count
from specchat.loading.hfquiet import quiet_bitsandbytes_casts, quiet_transformers
from specchat.loading.plan import ModelPlan
from specchat.loading.sources import load_failure


@dataclass
class Weights:
    """A loaded model, eval mode, and its parameter count as read (before int8 turns weights into buffers)."""

    model: Any
    params: int


def load_weights(checkpoint: Checkpoint, plan: ModelPlan) -> Weights:
    """The model from its checkpoint; a slim one's quantized layers still empty (on the meta device).
    A slim checkpoint is for w4a8, which runs on the CPU only: there is nothing to place."""
    if plan.quantization == "8bit":
        quiet_bitsandbytes_casts()
    try:
        with quiet_transformers():
            if checkpoint.slim:
                model = load_slim(Path(checkpoint.location))
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    checkpoint.location, **checkpoint.load_kwargs, **plan.placement
                ).eval()
    except ModelLoadError:
        raise
    except Exception as err:  # any failure inside transformers becomes one line for the user
        raise load_failure(err, plan.source, "the model") from err
    return Weights(model, parameter_count(model))
