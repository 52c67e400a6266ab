"""GGUF files are converted once into a plain safetensors checkpoint in the cache, keyed by the
GGUF's sha256 and the stored dtype, so every later start loads it directly (fast, mmap-able).

A conversion is written to a temporary directory and renamed into place only when complete (every
file fsynced first, the folder after); `specchat.json` inside marks a finished conversion and records the
facts the banner shows, and the size and sha256 of every file written. A conversion found damaged at a
later start (a file missing, cut short or changed) is rebuilt from its GGUF, with one notice line; one
that cannot be read (EIO, EACCES) is kept, and the start ends in one line naming the path and the errno,
as it does when the disk fills while converting.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import safetensors.torch
import torch
from gguf import LlamaFileType
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig
from transformers.integrations.gguf.reader import read_gguf_metadata

from specchat.cache import (
    building,
    cache_dir,
    disk_errors,
    file_sha256,
    into_place,
    is_verified,
    mark_verified,
    optional_write,
    os_error,
    private_dir,
)
from specchat.errors import ModelLoadError, one_line
from specchat.loading.devices import dtype_name
from specchat.loading.gguf import slim
from specchat.loading.gguf.config import file_config
from specchat.loading.gguf.header import read_tensors
from specchat.loading.gguf.metadata import quick_metadata
from specchat.loading.hfquiet import BarsToProgress, quiet_transformers
from specchat.progress import Progress, notify

META = "specchat.json"
CONVERSION = 3  # in the folder's name; one more when a conversion's output changes (2: Llama-3, 3: Gemma-3 rope)


def converted_dir(sha256: str, dtype: torch.dtype, slim: bool = False) -> Path:
    """A full conversion (every weight in `dtype`), or a slim one (loading/gguf/slim.py: the w4a8 modes)."""
    name = f"{sha256[:16]}-c{CONVERSION}-{dtype_name(dtype)}{'-slim' if slim else ''}"
    return cache_dir() / "converted" / name


def read_meta(directory: Path) -> dict:
    return json.loads((directory / META).read_text())


def gguf_digest(path: Path, progress: Progress | None = None) -> str:
    """sha256 of a GGUF file, remembered per (path, size, mtime) so it is hashed once."""
    memo = cache_dir() / "hashes" / (hashlib.sha256(str(path).encode()).hexdigest()[:24] + ".txt")
    with disk_errors(path, "read"):
        stat = path.stat()
        stamp = f"{stat.st_size} {stat.st_mtime_ns}"
        if memo.exists():
            saved_stamp, _, digest = memo.read_text().strip().rpartition(" ")
            if saved_stamp == stamp and len(digest) == 64:  # a memo cut short by a crash is not used
                return digest
        digest = file_sha256(path, progress)
    optional_write(lambda: _remember(memo, f"{stamp} {digest}\n"))  # where the cache is read-only: hashed again
    return digest


def _remember(memo: Path, text: str) -> None:
    private_dir(memo.parent)
    memo.write_text(text)


def ensure_converted(
    gguf: Path, sha256: str, dtype: torch.dtype, name: str, progress: Progress | None = None, slim: bool = False
) -> Path:
    """The converted checkpoint for `gguf` in `dtype` (slim: loading/gguf/slim.py), converting it first if it is not cached."""
    out = converted_dir(sha256, dtype, slim)
    if (out / META).exists() and not damage(out, progress):
        return out
    with building(out, f"the converted checkpoint of {name}", progress):
        if (out / META).exists():  # damaged, or converted by another process while this one waited
            problem = damage(out, progress)
            if not problem:
                return out
            if progress:
                notify(progress, f"rebuilding the converted checkpoint of {name}: {problem}")
            shutil.rmtree(out, ignore_errors=True)
        with disk_errors(out, f"convert {name} into the cache at"):
            _convert_into(out, gguf, dtype, name, progress, slim)
    return out


def _convert_into(
    out: Path, gguf: Path, dtype: torch.dtype, name: str, progress: Progress | None, slim: bool = False
) -> None:
    """Convert in a temporary directory and rename it into place only when complete and fsynced."""
    with into_place(out) as tmp:
        convert_gguf(gguf, dtype, tmp, name, progress, slim)
        tmp.chmod(0o700)  # made by transformers with the umask's mode


def gguf_facts(gguf: Path) -> dict:
    """Architecture, quantization type and chat-template presence, read from the GGUF header once
    specchat's own bounded reader (gguf/header.py) has checked every count, offset and size in it."""
    read_tensors(gguf)  # a truncated or malformed file ends here, in one line naming what is wrong
    try:
        metadata, _ = read_gguf_metadata(str(gguf))
    except Exception as err:  # a foreign file
        raise ModelLoadError(f"{gguf} is not a readable GGUF file ({one_line(err)})") from err
    if not metadata.get("tokenizer.chat_template"):
        raise ModelLoadError(
            f"{gguf.name} carries no chat template (tokenizer.chat_template), "
            f"which specchat needs to format the chat; use an instruct/chat GGUF"
        )
    return {
        "architecture": str(metadata.get("general.architecture", "?")),
        "quantization": _quantization_name(metadata.get("general.file_type")),
    }


def _quantization_name(file_type) -> str:
    """general.file_type as llama.cpp names it (Q4_K_M, ALL_F32, ...); "GGUF" when absent or unknown."""
    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except (ValueError, TypeError):
        return "GGUF" if file_type is None else f"GGUF file type {file_type}"


def convert_gguf(
    gguf: Path, dtype: torch.dtype, out: Path, name: str, progress: Progress | None = None, slim: bool = False
) -> None:
    """Dequantize `gguf` into a safetensors checkpoint with config and tokenizer in `out`; slim: only the
    tensors that stay float beside the w4a8 layers, the embeddings in the file's blocks (loading/gguf/slim.py)."""
    facts = gguf_facts(gguf)
    if progress:
        what = "its float tensors (w4a8)" if slim else dtype_name(dtype)
        progress(f"converting {name} from GGUF {facts['quantization']}: {what} (first start only)", None)
    _write_checkpoint(gguf, dtype, out, progress, slim)
    meta = {
        "name": name,
        "quantization": facts["quantization"],
        "dtype": dtype_name(dtype),
        "slim": slim,
        "architecture": facts["architecture"],
        "gguf": _cache_relative(gguf),
        "files": _file_records(out),
    }
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")


def _write_checkpoint(gguf: Path, dtype: torch.dtype, out: Path, progress: Progress | None, slim: bool) -> None:
    """Tokenizer, config and weights through transformers' GGUF reading: what it fails on in a file whose header
    is whole (a missing vocabulary, a config its tensors contradict) is one line; an OSError or MemoryError
    passes as it is, for the cache to tell from damage."""
    try:
        with quick_metadata():
            tokenizer = _gguf_tokenizer(gguf)
            if slim:
                _save_slim(gguf, tokenizer, out, progress)
            else:
                save_checkpoint(_gguf_model(gguf, dtype, progress), tokenizer, out)
    except (ModelLoadError, OSError, MemoryError):
        raise
    except Exception as err:  # transformers' and gguf-py's parsing of the file's content
        if os_error(err) is not None:  # an I/O failure safetensors reports as text ("(os error 28)"): the cache's
            raise
        raise ModelLoadError(f"cannot convert {gguf}: {one_line(err)}") from err


def _cache_relative(path: Path) -> str:
    """A path under the cache root as relative to it (the cache may move), any other as absolute."""
    path = path.resolve()
    root = cache_dir().resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _file_records(directory: Path) -> dict:
    """{name: {"bytes", "sha256"}} of every file written, each marked verified as it stands."""
    records = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")):
        records[path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        mark_verified(path, records[path.name]["sha256"])
    return records


def damage(directory: Path, progress: Progress | None = None) -> str:
    """'' when a finished conversion is whole, else what is wrong with it: its record missing or not
    JSON, a recorded file missing or not at its size and sha256 (hashed once per change), or a
    safetensors file cut short (also checked for conversions written before files were recorded).
    A failure to read (EIO, EACCES) is raised as ModelLoadError: it is no sign of damage."""
    with disk_errors(directory, "read the converted checkpoint"):
        return _damage(directory, progress)


def _damage(directory: Path, progress: Progress | None) -> str:
    try:
        files = read_meta(directory).get("files", {})
    except (FileNotFoundError, ValueError, AttributeError):  # a record that is not a JSON table too
        return f"its {META} is unreadable"
    for name, record in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if not is_verified(path, record["bytes"], record["sha256"], progress):
            return f"{name} differs from what was written (size or sha256)"
    for path in directory.glob("*.safetensors"):
        if not safetensors_whole(path):
            return f"{path.name} is cut short"
    return ""


def safetensors_whole(path: Path) -> bool:
    """True when the file's header reads and its tensors end exactly at the end of the file; an I/O
    error other than the file being gone is raised (OSError)."""
    try:
        with path.open("rb") as src:
            length = int.from_bytes(src.read(8), "little")
            header = json.loads(src.read(length))
            size = os.fstat(src.fileno()).st_size
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        return size == 8 + length + max(ends, default=0)
    except (FileNotFoundError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


def _gguf_tokenizer(gguf: Path):

    with quiet_transformers():
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)


def _gguf_model(gguf: Path, dtype: torch.dtype, progress: Progress | None):

    bars = BarsToProgress(progress, f"dequantizing {gguf.name}")
    config = file_config(gguf, progress)
    with quiet_transformers(), contextlib.redirect_stderr(bars):
        model, info = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            config=config,
            dtype=dtype,
            local_files_only=True,
            quantization_config=GgufConfig(dequantize=True),
            output_loading_info=True,
        )
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ModelLoadError(
            f"{gguf.name} lacks {len(missing)} weight(s) the model needs "
            f"(e.g. {missing[0]}); transformers cannot use this GGUF"
        )
    return model.eval()


def _save_slim(gguf: Path, tokenizer, out: Path, progress: Progress | None) -> None:
    """Config, generation config, tokenizer, and slim.write_weights' tensors."""
    config = file_config(gguf, progress)
    out.mkdir(parents=True)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    slim.write_weights(gguf, config, out)
    tokenizer.save_pretrained(out)


def save_checkpoint(model, tokenizer, out: Path) -> None:
    """Config, weights (safetensors, shared tensors stored once), generation config and tokenizer."""
    out.mkdir(parents=True)
    config = copy.deepcopy(model.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config  # the saved weights are plain tensors
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    # called through its module: tests/guarantees/test_cache_faults.py stops a conversion in save_model
    safetensors.torch.save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def is_converted(sha256: str, dtype: torch.dtype, slim: bool = False) -> bool:
    """A finished conversion is in the cache; a damaged one is not (ensure_converted rebuilds it)."""
    directory = converted_dir(sha256, dtype, slim)
    return (directory / META).exists() and not damage(directory)
