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
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch
from gguf import LlamaFileType
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig
from transformers.integrations.gguf.reader import read_gguf_metadata

from specchat.cache_folder import (
    built_once,
    cache_dir,
    file_records,
    folder_damage,
    os_error,
    read_record,
)
from specchat.errors import ModelLoadError, one_line
from specchat.loading.devices import dtype_name
from specchat.loading.gguf import slim, tensors
from specchat.loading.gguf.config import file_config
from specchat.loading.gguf.header import CHAT_TEMPLATE, TOKENIZER_DIGEST, Header, read_tensors
from specchat.loading.gguf.metadata import quick_metadata
from specchat.loading.hfquiet import BarsToProgress, quiet_transformers
from specchat.progress import Progress

META = "specchat.json"
CONVERSION = 3  # in the folder's name; one more when a conversion's output changes (2: Llama-3, 3: Gemma-3 rope)


def converted(
    sha256: str, dtype: torch.dtype, w4a8: bool, name: str, gguf_path: Callable[[], Path], progress: Progress | None
) -> Path:
    """The cached conversion of the GGUF whose sha256 this is: slim for the w4a8 modes where the file streams
    (tensors.streamable), else full. gguf_path() gives the file, asked for only when it must be converted."""
    if is_converted(sha256, dtype, w4a8):
        return converted_dir(sha256, dtype, w4a8)
    gguf = gguf_path()
    return ensure_converted(gguf, sha256, dtype, name, progress, w4a8 and tensors.streamable(gguf))


def converted_dir(sha256: str, dtype: torch.dtype, slim: bool = False) -> Path:
    """A full conversion (every weight in `dtype`), or a slim one (loading/gguf/slim.py: the w4a8 modes)."""
    name = f"{sha256[:16]}-c{CONVERSION}-{dtype_name(dtype)}{'-slim' if slim else ''}"
    return cache_dir() / "converted" / name


def is_converted(sha256: str, dtype: torch.dtype, slim: bool = False) -> bool:
    """A finished conversion is in the cache; a damaged one is not (ensure_converted rebuilds it)."""
    directory = converted_dir(sha256, dtype, slim)
    return (directory / META).exists() and not damage(directory)


def damage(directory: Path, progress: Progress | None = None) -> str:
    """'' when a finished conversion is whole, else what is wrong with it (cache_folder.folder_damage: its record,
    each recorded file's size and sha256, its safetensors files cut short). A failure to read (EIO, EACCES) is
    raised as ModelLoadError: it is no sign of damage."""
    return folder_damage(directory, META, "read the converted checkpoint", progress)


def read_meta(directory: Path) -> dict:
    return read_record(directory, META)


def ensure_converted(
    gguf: Path, sha256: str, dtype: torch.dtype, name: str, progress: Progress | None = None, slim: bool = False
) -> Path:
    """The converted checkpoint for `gguf` in `dtype` (slim: loading/gguf/slim.py), converting it first if it is
    not cached: in a temporary directory renamed into place only when complete and fsynced (cache_folder.built_once);
    a damaged one is removed first, with one notice line."""
    out = converted_dir(sha256, dtype, slim)
    built_once(
        out,
        f"the converted checkpoint of {name}",
        lambda: damage(out, progress) if (out / META).exists() else None,
        lambda tmp: _convert_into(tmp, gguf, dtype, name, progress, slim),
        f"convert {name} into the cache at",
        progress,
    )
    return out


def _convert_into(
    tmp: Path, gguf: Path, dtype: torch.dtype, name: str, progress: Progress | None, slim: bool = False
) -> None:
    convert_gguf(gguf, dtype, tmp, name, progress, slim)
    tmp.chmod(0o700)  # made by transformers with the umask's mode


def gguf_facts(gguf: Path) -> dict:
    """Architecture and quantization type, read from the GGUF header (by transformers' reader: call it once
    specchat's own bounded one, gguf/header.py, has checked every count, offset and size). A file without a chat
    template (a base model's) is welcome: as a drafter it needs none (the target's is used), and as a target its
    tokenizer gets specchat's plain User:/Assistant: template, as a checkpoint's does (shared_tokenizer.py)."""
    try:
        metadata, _ = read_gguf_metadata(str(gguf))
    except Exception as err:  # a foreign file
        raise ModelLoadError(f"{gguf} is not a readable GGUF file ({one_line(err)})") from err
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
    tensors that stay float beside the w4a8 layers, the embeddings in the file's blocks (loading/gguf/slim.py).
    The header is read once, first: a truncated or malformed file ends here, in one line naming what is wrong."""
    header = read_tensors(gguf)
    facts = gguf_facts(gguf)
    if progress:
        what = "its float tensors (w4a8)" if slim else dtype_name(dtype)
        progress(f"converting {name} from GGUF {facts['quantization']}: {what} (first start only)", None)
    _write_checkpoint(gguf, header, dtype, out, progress, slim)
    meta = {
        "name": name,
        "quantization": facts["quantization"],
        "dtype": dtype_name(dtype),
        "slim": slim,
        "architecture": facts["architecture"],
        "gguf": _cache_relative(gguf),
        "files": file_records(out),
    }
    (out / META).write_text(json.dumps(meta, indent=1) + "\n")


def _write_checkpoint(
    gguf: Path, header: Header, dtype: torch.dtype, out: Path, progress: Progress | None, slim: bool
) -> None:
    """Tokenizer, config and weights through transformers' GGUF reading: what it fails on in a file whose header
    is whole (a missing vocabulary, a config its tensors contradict) is one line; an OSError or MemoryError
    passes as it is, for the cache to tell from damage."""
    try:
        with quick_metadata():
            tokenizer = _gguf_tokenizer(gguf, header[0])
            if slim:
                _save_slim(gguf, header, tokenizer, out, progress)
            else:
                save_checkpoint(_gguf_model(gguf, header, dtype, progress), tokenizer, out)
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


class SavedTokenizer:
    """A tokenizer as the files its save_pretrained wrote (tokenizer.json, its config, the chat template), to be
    written into each checkpoint whose GGUF holds the same tokenizer."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files

    def save_pretrained(self, out: Path) -> None:
        for name, data in self.files.items():
            (Path(out) / name).write_bytes(data)


TEMPLATE_FILE = "chat_template.jinja"  # where a tokenizer's save_pretrained writes its chat template
_last_tokenizer: dict[str, SavedTokenizer] = {}  # {the tokenizer digest of the GGUF last read: its files, no template}


def _gguf_tokenizer(gguf: Path, facts: dict) -> SavedTokenizer:
    """The GGUF's tokenizer through transformers (5-8 s for a 151,936-token vocabulary), or the one this process
    made last where the file's tokenizer keys and architecture are the same bytes (header.TOKENIZER_DIGEST), with
    this file's own chat template: a pair of one family, such as the bundled one (whose two templates differ),
    converts its vocabulary once. Kept only where transformers wrote the file's template as the file holds it."""
    digest, template = facts[TOKENIZER_DIGEST], facts.get(CHAT_TEMPLATE)
    kept = _last_tokenizer.get(digest)
    if kept is not None:
        return SavedTokenizer(kept.files | ({TEMPLATE_FILE: template} if template is not None else {}))
    with quiet_transformers():
        made = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    with tempfile.TemporaryDirectory() as folder:
        made.save_pretrained(folder)
        files = {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}
    _last_tokenizer.clear()  # one kept: the files of a 151,936-token vocabulary are 11 MB
    if files.get(TEMPLATE_FILE) == template:
        _last_tokenizer[digest] = SavedTokenizer({name: data for name, data in files.items() if name != TEMPLATE_FILE})
    return SavedTokenizer(files)


def _gguf_model(gguf: Path, header: Header, dtype: torch.dtype, progress: Progress | None):

    bars = BarsToProgress(progress, f"dequantizing {gguf.name}")
    config = file_config(gguf, progress, header)
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


def _save_slim(gguf: Path, header: Header, tokenizer, out: Path, progress: Progress | None) -> None:
    """Config, generation config, tokenizer, and slim.write_weights' tensors."""
    config = file_config(gguf, progress, header)
    out.mkdir(parents=True)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    slim.write_weights(gguf, config, out, header)
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
