"""What a model `source` string names: a bundled model, a local directory, a GGUF file or a hub id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import ModelLoadError, one_line
from specchat.loading.assets import bundled_model

OFFLINE_HINT = (
    "if there is no network, set HF_HUB_OFFLINE=1 to use the local hub cache, "
    "or point the source at a local directory or .gguf file"
)
BUNDLED_PREFIX = "bundled:"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class Source:
    kind: str  # bundled | dir | gguf | hub
    location: str  # bundled name, absolute path, or hub id
    name: str  # a short display name


def resolve_source(source: str) -> Source:
    text = source.strip()
    if not text:
        raise ModelLoadError(
            "the model source is empty; give a hub id, a local directory, a .gguf file or bundled:<name>"
        )
    if text.startswith(BUNDLED_PREFIX):
        return _bundled(text[len(BUNDLED_PREFIX) :])
    path = Path(text).expanduser()
    if path.is_dir():
        return Source("dir", str(path.resolve()), path.resolve().name)
    if path.is_file():
        return _file(path)
    if text.lower().endswith(".gguf") or text.startswith(("/", ".", "~")) or text.count("/") > 1:
        raise ModelLoadError(f"model source {text} does not exist (no such file or directory)")
    if HUB_ID.match(text):
        return Source("hub", text, text.rsplit("/", 1)[-1])
    raise ModelLoadError(
        f"model source '{text}' is neither a hub id (org/name), a local directory, a .gguf file nor bundled:<name>"
    )


def _bundled(name: str) -> Source:
    return Source("bundled", name, bundled_model(name).name)


def _file(path: Path) -> Source:
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(
            f"model source {path} is a file but not a .gguf file; give a "
            f"directory with config.json, a .gguf file, or a hub id"
        )
    return Source("gguf", str(path.resolve()), path.stem)


def load_failure(err: Exception, source: Source, what: str) -> ModelLoadError:
    """The one line a failure to read `what` (the model, the tokenizer) of a source ends the start with."""
    if source.kind == "hub":
        return ModelLoadError(
            f"cannot load {what} of {source.location} from the Hugging Face hub ({one_line(err)}); {OFFLINE_HINT}"
        )
    return ModelLoadError(f"cannot load {what} of {source.name} from {source.location}: {one_line(err)}")
