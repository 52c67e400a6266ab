"""One tokenizer for a pair whose two checkpoints hold the same tokenizer files.

A target and its drafter usually ship byte-identical tokenizer files (the bundled Qwen2.5-Coder pair
does: 11 MB of tokenizer.json each). Reading them twice, and then comparing 152k ids one by one to
prove the two tokenizers agree, took about 2 s of a 15 s start. When the files are the same, the
drafter gets the target's tokenizer object and there is nothing to compare.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

# What AutoTokenizer reads from a directory: the tokenizer's own files, chat templates, remote code.
TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|vocab.*|merges\.txt|special_tokens_map\.json|added_tokens\.json|"
    r"chat_template.*|.*\.model|.*\.tiktoken|.*\.py)$"
)


def tokenizer_digest(location: str, trust_remote_code: bool) -> str | None:
    """A digest of everything a local checkpoint's tokenizer is built from: its tokenizer files, and the
    config's model type (which picks the tokenizer class when tokenizer_config.json names none).
    None for a hub id: those are not compared."""
    folder = Path(location)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(f"remote code: {trust_remote_code}\n".encode())
    for path in sorted(folder.iterdir()):
        if path.is_file() and TOKENIZER_FILES.match(path.name) and not path.name.endswith(".verified"):
            digest.update(f"{path.name}\n{path.stat().st_size}\n".encode())
            digest.update(path.read_bytes())
    digest.update(f"model type: {_model_type(folder)}".encode())
    return digest.hexdigest()


def _model_type(folder: Path) -> str:
    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return ""
