"""transformers' GGUF config and tokenizer, read at the speed of the file.

For the bundled models transformers reads a GGUF's metadata with gguf-py's GGUFReader, once for the config and
once more for the tokenizer: 15 s a read for the drafter, most of it numpy's memmap subclass sliced a
million times (the 151,936-token vocabulary). Inside `quick_metadata()` the reader maps the file as a plain
array (a third of the time, the same bytes) and each file's metadata is read once.
"""

from __future__ import annotations

import contextlib
import copy
import types

import gguf.gguf_reader as reader_module
import numpy as np
import transformers.modeling_gguf_pytorch_utils as legacy


def _plain_memmap(*args, **kwargs) -> np.ndarray:
    return np.memmap(*args, **kwargs).view(np.ndarray)


@contextlib.contextmanager
def quick_metadata():
    """Within the block: gguf-py's reader slices plain arrays, and transformers' legacy GGUF metadata read
    (load_gguf_checkpoint without tensors) happens once per file."""
    numpy_as_read, load_as_is = reader_module.np, legacy.load_gguf_checkpoint
    plain = types.ModuleType("numpy")
    plain.__dict__.update(np.__dict__)
    plain.memmap = _plain_memmap
    read: dict = {}

    def load_once(path, return_tensors=False, *args, **kwargs):
        if return_tensors:
            return load_as_is(path, return_tensors, *args, **kwargs)
        if path not in read:
            read[path] = load_as_is(path, False, *args, **kwargs)
        return copy.deepcopy(read[path])  # callers change what they get (the config dict)

    reader_module.np, legacy.load_gguf_checkpoint = plain, load_once
    try:
        yield
    finally:
        reader_module.np, legacy.load_gguf_checkpoint = numpy_as_read, load_as_is
