"""The first materialise step: a planned source as a checkpoint from_pretrained can read.

A hub id and a local directory are read as they are; a GGUF file, or a bundled model (its GGUF assembled from
pip packages: assets.py), is converted once into a cached safetensors checkpoint (gguf/convert.py): slim for the
w4a8 modes where the file streams (gguf/slim.py), else full. Only when the conversion is not cached is a bundled
model's file assembled, or a file's header read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specchat.cache_folder import remembered_sha256
from specchat.config import W4A8_MODES
from specchat.errors import ModelLoadError
from specchat.loading import assets
from specchat.loading.gguf import convert as gguf_convert
from specchat.loading.plan import ModelPlan
from specchat.loading.sources import Source
from specchat.progress import Progress


@dataclass(frozen=True)
class Checkpoint:
    """Where from_pretrained reads a model (a local directory, or a hub id), and how."""

    location: str
    local: bool
    quantization: str  # what the checkpoint itself is: none, or a GGUF type
    identity: str = ""  # what the weights are, for caches derived from them (a sha256, a fingerprint)
    load_kwargs: dict = field(default_factory=dict, compare=False)  # from_pretrained's, for weights and tokenizer
    gguf: Callable[[], Path] | None = field(default=None, compare=False)  # the GGUF file it was converted from,
    # found only when called (a bundled model's is assembled then); None when it was not converted
    slim: bool = False  # only the float tensors of a w4a8 model (loading/gguf/slim.py); the rest comes quantized


def checkpoint_for(plan: ModelPlan, progress: Progress | None = None) -> Checkpoint:
    """A directory (or hub id) from_pretrained can read, converting GGUF files once if needed."""
    source = plan.source
    kwargs: dict = {"trust_remote_code": plan.trust_remote_code}
    if source.kind == "hub":
        identity = hashlib.sha256(f"{source.location}@{plan.revision}".encode()).hexdigest()
        revision = {"revision": plan.revision} if plan.revision else {}
        return Checkpoint(source.location, False, "none", identity, kwargs | revision)
    kwargs["local_files_only"] = True
    if source.kind == "dir":
        directory = Path(source.location)
        if not (directory / "config.json").is_file():
            raise ModelLoadError(
                f"{source.location} has no config.json; a model directory comes "
                f"from save_pretrained (or give a .gguf file)"
            )
        return Checkpoint(source.location, True, "none", directory_identity(directory), kwargs)
    converted_dir = converted(plan, progress)
    meta = gguf_convert.read_meta(converted_dir)
    return Checkpoint(
        str(converted_dir),
        True,
        meta["quantization"],
        converted_dir.name,
        kwargs,
        lambda: gguf_path(source, progress),
        slim=bool(meta.get("slim")),
    )


def directory_identity(directory: Path) -> str:
    """A fingerprint of a model directory: its path and each file's name, size and mtime."""
    digest = hashlib.sha256(str(directory.resolve()).encode())
    for path in sorted(directory.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def converted(plan: ModelPlan, progress: Progress | None = None) -> Path:
    """The cached conversion of a GGUF source (see the module's docstring)."""
    source = plan.source
    if source.kind == "bundled":
        sha = assets.bundled_model(source.location).sha256
    else:
        sha = remembered_sha256(Path(source.location), progress)
    w4a8 = plan.quantization in W4A8_MODES
    return gguf_convert.converted(sha, plan.dtype, w4a8, source.name, lambda: gguf_path(source, progress), progress)


def gguf_path(source: Source, progress: Progress | None = None) -> Path:
    """A GGUF source's file: a bundled model's assembled (once, cached), or the file itself."""
    if source.kind == "bundled":
        return assets.bundled_gguf_path(source.location, progress)
    return Path(source.location)
