"""transformers' GGUF config and tokenizer, read at the speed of the file.

transformers still builds a GGUF's config (for the architectures its newer reader does not cover, Qwen2 and Llama
among them) with its legacy metadata read, on gguf-py's GGUFReader: 5 s for the bundled target, most of it a
million numpy views of its 151,936-token vocabulary and merges. Inside `quick_metadata()` that read (no tensors)
happens once per file and walks the header with struct (metadata_reader.py: 0.1 s); a read with tensors, in any
thread, gets gguf-py's own reader, on a plain array map (a third of its time, the same bytes).
"""

from __future__ import annotations

import copy
import os
import threading
import types

import gguf
import gguf.gguf_reader as reader_module
import numpy as np
import transformers.modeling_gguf_pytorch_utils as legacy

from specchat.loading.gguf.metadata_reader import MetadataReader
from specchat.loading.gguf.shared_patch import SharedPatch


def _plain_memmap(*args, **kwargs) -> np.ndarray:
    return np.memmap(*args, **kwargs).view(np.ndarray)


_saved: tuple = ()  # gguf-py's numpy, transformers' legacy read and gguf's GGUFReader, as they were before the patch
_read: dict = {}  # (real path, size, mtime) -> the metadata transformers read from it
_metadata_only = threading.local()  # .on: this thread is in a legacy read without tensors


def _reader(path, *args, **kwargs):
    """gguf.GGUFReader while patched: the struct walk for this thread's legacy read without tensors, else gguf-py's."""
    if getattr(_metadata_only, "on", False):
        return MetadataReader(path)
    return _saved[2](path, *args, **kwargs)


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
        _metadata_only.on = True
        try:
            _read[key] = load_as_is(path, False, *args, **kwargs)
        finally:
            _metadata_only.on = False
    return copy.deepcopy(_read[key])  # callers change what they get (the config dict)


def _apply() -> None:
    global _saved
    _saved = (reader_module.np, legacy.load_gguf_checkpoint, gguf.GGUFReader)
    plain = types.ModuleType("numpy")
    plain.__dict__.update(np.__dict__)
    plain.memmap = _plain_memmap
    reader_module.np, legacy.load_gguf_checkpoint, gguf.GGUFReader = plain, _load_once, _reader


def _undo() -> None:
    reader_module.np, legacy.load_gguf_checkpoint, gguf.GGUFReader = _saved
    _read.clear()


_QUICK = SharedPatch(_apply, _undo)


def quick_metadata():
    """Within the block: transformers' legacy GGUF metadata read (load_gguf_checkpoint without tensors) happens once
    per file, on the struct walk, and gguf-py's reader slices plain arrays. Blocks may overlap (two threads loading): the
    patch goes in with the first and comes out with the last, never left in place."""
    return _QUICK.held()
