"""A GGUF file's tensors under transformers' names, read a tensor at a time.

transformers' own GGUF loading dequantizes every tensor of the file into one dict before it builds the
model: 6.7 GB of float32 for the bundled 1.5B target, and a first start that peaked at 12.5 GB. specchat
reads a file with the same name map and the same tensor processor (so every value is the one that loading
gives), one tensor at a time, in row chunks where the processor leaves a tensor as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, dequantize
from torch import nn
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    LlamaTensorProcessor,
    TensorProcessor,
    get_gguf_hf_weights_map,
)

from specchat.errors import ModelLoadError
from specchat.loading.gguf.header import Header, read_tensors, shown
from specchat.loading.gguf.shared_patch import SharedPatch
from specchat.quant.shared import name_of

CHUNK_ROWS = 8192  # rows dequantized at a time: 8192 × 1536 floats is 50 MB
PERMUTED = ("attn_q.", "attn_k.")  # what LlamaTensorProcessor reorders; it leaves every other tensor as it is
TIED_EMBEDDINGS = "token_embd.weight"  # what a tied head reads in a file with no output.weight


def streamable(gguf: Path) -> bool:
    """Whether specchat can read this file's architecture a tensor at a time: its transformers tensor processor
    is the plain one, or Llama's (which only reorders the query and key weights)."""
    facts, _ = read_tensors(gguf)
    processor = TENSOR_PROCESSORS.get(facts.get("general.architecture", ""), TensorProcessor)
    return processor in (TensorProcessor, LlamaTensorProcessor)


class GGUFTensors:
    """The tensors of `gguf` by the names of `model`'s state dict (a model with the file's config; its
    parameters may be on the meta device); header: read_tensors' of `gguf`, where the caller has read it already."""

    def __init__(self, gguf: Path, model: nn.Module, header: Header | None = None):

        facts, tensors = header or read_tensors(gguf)
        config = model.config.get_text_config().to_dict()
        self.parsed = {"config": config, "tensors": {}}  # what a processor may read (Llama's: the head counts)
        self.processor = TENSOR_PROCESSORS.get(facts.get("general.architecture", ""), TensorProcessor)(config=config)
        with _name_map_built_once():
            self.names = get_gguf_hf_weights_map(model, self.processor)  # GGUF name → transformers name
        self.by_name = {self.names[t.name]: t for t in tensors if t.name in self.names}
        self.tied = _tied_names(model)
        for head in self.tied:  # embeddings kept in their blocks (slim) are no state-dict name: the head reads them
            embeddings = next((t for t in tensors if t.name == TIED_EMBEDDINGS), None)
            if head not in self.by_name and self.tied[head] not in self.by_name and embeddings is not None:
                self.by_name[head] = embeddings
        self.path = Path(gguf)
        _check_shapes(self.path, self.by_name, model)
        _check_types(self.path, self.by_name)

    def info(self, name: str):
        """The GGUF tensor behind a transformers name (a tied head: the input embeddings')."""
        tensor = self.by_name.get(name) or self.by_name.get(self.tied.get(name, ""))
        if tensor is None:
            raise ModelLoadError(f"{self.path} has no tensor for {name}, which its model needs")
        return tensor

    def __contains__(self, name: str) -> bool:
        return name in self.by_name or self.tied.get(name, "") in self.by_name

    def kind(self, name: str) -> str:
        """The tensor's GGML type name: F32, Q4_K, Q8_0, ..."""
        return self.info(name).tensor_type.name

    def unchanged(self, name: str) -> bool:
        """Whether transformers takes this tensor as the file stores it (its processor reorders nothing)."""
        gguf_name = self.info(name).name
        return type(self.processor) is TensorProcessor or not any(part in gguf_name for part in PERMUTED)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's stored bytes, uint8 [rows, bytes a row], read from the file."""
        return torch.from_numpy(self.info(name).data.view(np.uint8).reshape(self.rows(name), -1))

    def rows(self, name: str) -> int:
        return self.info(name).rows

    def row_order(self, name: str) -> torch.Tensor | None:
        """Where transformers' processor only reorders a tensor's rows (Llama's q and k): the stored row each
        row of the model's weight is, int64 [rows]; None where it takes the tensor as stored. ValueError where
        the processor does more than reorder rows."""
        if self.unchanged(name):
            return None
        tensor = self.info(name)
        rows = np.arange(tensor.rows, dtype=np.float64).reshape(tensor.rows, 1)  # each row's own index, exactly
        result = self.processor.process(
            weights=rows, name=tensor.name, tensor_key_mapping=self.names, parsed_parameters=self.parsed
        )
        order = np.asarray(result.weights)
        if order.shape != rows.shape or not np.array_equal(np.sort(order, axis=0), rows):
            raise ValueError(f"transformers does more than reorder the rows of {shown(tensor.name)}")
        return torch.from_numpy(order.reshape(-1).astype(np.int64))

    def float_chunks(self, name: str) -> Iterator[torch.Tensor]:
        """An unchanged 2-d tensor's float32 rows, CHUNK_ROWS at a time."""
        if not self.unchanged(name) or len(self.info(name).shape) < 2:
            raise ValueError(f"{name} is not read in row chunks")
        return _row_chunks(self.info(name))

    def float(self, name: str) -> torch.Tensor:
        """The tensor as transformers loads it, float32."""
        tensor = self.info(name)
        if self.unchanged(name):
            return _dequantized(tensor)

        result = self.processor.process(
            weights=dequantize(tensor.data, tensor.tensor_type),
            name=tensor.name,
            tensor_key_mapping=self.names,
            parsed_parameters=self.parsed,
        )
        return torch.from_numpy(np.array(result.weights, dtype=np.float32))


def _check_shapes(path: Path, by_name: dict, model: nn.Module) -> None:
    """Each tensor the model takes has the shape of the parameter it fills (the model is built from the file's
    own config, which a damaged or hostile file may contradict): else one line, before any value is read."""
    wanted = {name: tuple(value.shape) for name, value in model.state_dict(keep_vars=True).items()}
    for name, tensor in by_name.items():
        shape = tuple(reversed(tensor.shape))  # ggml order → torch order
        if name in wanted and shape != wanted[name]:
            raise ModelLoadError(
                f"{path} contradicts itself: tensor {shown(tensor.name)} is {list(shape)}, but "
                f"its own config makes {name} {list(wanted[name])}"
            )


def _check_types(path: Path, by_name: dict) -> None:
    """Each tensor the model takes is of a type gguf-py dequantizes (transformers reads every tensor through it):
    else one line naming the tensor and its type, before any value is read."""
    readable: dict = {}
    for tensor in by_name.values():
        kind = tensor.tensor_type
        if kind not in readable:
            try:
                dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8), kind)
                readable[kind] = True
            except NotImplementedError:
                readable[kind] = False
        if not readable[kind]:
            raise ModelLoadError(
                f"{path}: tensor {shown(tensor.name)} is stored as {kind.name}, a type gguf-py {_gguf_version()} "
                f"cannot dequantize; use a file of another type (Q4_K_M, Q5_K_M, Q6_K, Q8_0, ...)"
            )


def _gguf_version() -> str:

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(version unknown)"


_name_map_build = gguf.get_tensor_name_map  # gguf-py's own, as imported
_NAME_MAP_ONCE = SharedPatch(
    lambda: setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(_name_map_build)),
    lambda: setattr(gguf, "get_tensor_name_map", _name_map_build),
)


def _name_map_built_once():
    """get_gguf_hf_weights_map rebuilds gguf-py's name map for every submodule (319 times, 6.5 s for the
    drafter); within the block the same (architecture, layers) map is built once. Blocks may overlap (two threads
    loading): gguf-py's own function comes back when the last one ends."""
    return _NAME_MAP_ONCE.held()


def _dequantized(tensor) -> torch.Tensor:
    """A GGUF tensor's float32 values, dequantized CHUNK_ROWS rows at a time (each row is independent)."""
    if len(tensor.shape) < 2:
        return torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
    return torch.cat(list(_row_chunks(tensor)))


def _row_chunks(tensor) -> Iterator[torch.Tensor]:

    data = tensor.data
    for start in range(0, data.shape[0], CHUNK_ROWS):
        chunk = dequantize(data[start : start + CHUNK_ROWS], tensor.tensor_type)
        yield torch.from_numpy(np.array(chunk, dtype=np.float32))


def _tied_names(model: nn.Module) -> dict[str, str]:
    """{output head weight: input embedding weight} when the config ties them, else {}."""
    if not getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        return {}
    head, embed = name_of(model, model.get_output_embeddings()), name_of(model, model.get_input_embeddings())
    if head is None or embed is None:
        return {}
    return {f"{head}.weight": f"{embed}.weight"}
