"""transformers' GGUF config and tokenizer, read at the speed of the file.

For the bundled models transformers reads a GGUF's metadata with gguf-py's GGUFReader, once for the config and
once more for the tokenizer: 15 s a read for the drafter, most of it numpy's memmap subclass sliced a
million times (the 151,936-token vocabulary). Inside `quick_metadata()` the reader maps the file as a plain
array (a third of the time, the same bytes) and each file's metadata is read once.
"""

from __future__ import annotations

import copy
import os
import types

import gguf.gguf_reader as reader_module
import numpy as np
import transformers.modeling_gguf_pytorch_utils as legacy

from specchat.loading.gguf.shared_patch import SharedPatch


def _plain_memmap(*args, **kwargs) -> np.ndarray:
    return np.memmap(*args, **kwargs).view(np.ndarray)


_saved: tuple = ()  # gguf-py's numpy and transformers' reader, as they were before the patch
_read: dict = {}  # (real path, size, mtime) -> the metadata transformers read from it


def _file_key(path) -> tuple:
    """A file's identity for the metadata cache: its real path, size and change time (a file written again at the
    same path, as tests do, is read again)."""
    info = os.stat(path)
    return os.path.realpath(path), info.st_size, info.st_mtime_ns


def _load_once(path, return_tensors=False, *args, **kwargs):
    load_as_is = _saved[1]
    if return_tensors:
        return load_as_is(path, return_tensors, *args, **kwargs)
    key = _file_key(path)
    if key not in _read:
        _read[key] = load_as_is(path, False, *args, **kwargs)
    return copy.deepcopy(_read[key])  # callers change what they get (the config dict)


def _apply() -> None:
    global _saved
    _saved = (reader_module.np, legacy.load_gguf_checkpoint)
    plain = types.ModuleType("numpy")
    plain.__dict__.update(np.__dict__)
    plain.memmap = _plain_memmap
    reader_module.np, legacy.load_gguf_checkpoint = plain, _load_once


def _undo() -> None:
    reader_module.np, legacy.load_gguf_checkpoint = _saved
    _read.clear()


_QUICK = SharedPatch(_apply, _undo)


def quick_metadata():
    """Within the block: gguf-py's reader slices plain arrays, and transformers' legacy GGUF metadata read
    (load_gguf_checkpoint without tensors) happens once per file. Blocks may overlap (two threads loading): the
    patch goes in with the first and comes out with the last, never left in place."""
    return _QUICK.held()
