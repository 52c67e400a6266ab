"""Draft heads trained for a target (`specchat train-drafter`, speculative/drafters/head.py), kept in the cache
folder under the target's identity (its GGUF's sha256, a folder's fingerprint), and put on the target as it loads,
where the `head` drafter finds it. A file that cannot be read as a head is passed over with one notice line: the
chat loads without it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specchat.cache_folder import cache_dir
from specchat.progress import Progress, notify
from specchat.speculative import model_io
from specchat.speculative.drafters.head import FeatureHead

FORMAT = 1


def draft_head_path(identity: str) -> Path:
    return cache_dir() / "draft-heads" / f"{identity[:32]}.pt"


def head_record(head: FeatureHead, trained: dict) -> dict:
    """What a head file holds: its shape, its weights, and how it was trained (the report's figures)."""
    hidden, width = head.out.out_features, head.out.in_features
    return {"format": FORMAT, "hidden": hidden, "width": width, "state": head.state_dict(), "trained": trained}


def head_from_record(record: dict) -> FeatureHead:
    if record.get("format") != FORMAT:
        raise ValueError(f"format {record.get('format')!r}, not {FORMAT}")
    head = FeatureHead(int(record["hidden"]), int(record["width"]))
    head.load_state_dict(record["state"])
    return head.eval()


def read_head(path: Path) -> tuple[FeatureHead, dict]:
    """The head a file holds and its training's record; ValueError (or OSError) where it holds none."""
    record = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(record, dict):
        raise ValueError("not a draft head")
    return head_from_record(record), dict(record.get("trained") or {})


def attach_draft_head(model: nn.Module, identity: str, progress: Progress | None = None) -> str:
    """Put the draft head trained for this target on it (model_io.DRAFT_HEAD), where one is stored and fits its
    hidden size; a line for the banner ("" where none is)."""
    path = draft_head_path(identity) if identity else None
    if path is None or not path.is_file():
        return ""
    try:
        head, trained = read_head(path)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:
        notify(progress, f"the draft head {path} cannot be read ({str(err)[:200]}); the chat runs without it")
        return ""
    hidden = model.get_input_embeddings().embedding_dim if hasattr(model.get_input_embeddings(), "embedding_dim") else 0
    if hidden and hidden != head.out.out_features:
        notify(progress, f"the draft head {path} is for hidden size {head.out.out_features}, not {hidden}; not used")
        return ""
    setattr(model, model_io.DRAFT_HEAD, head)
    agreement = trained.get("agreement")
    return f"draft head {path.name}" + (
        f" (first-draft agreement {agreement:.0%} on held-out text)" if agreement else ""
    )
