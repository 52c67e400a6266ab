"""`make lint`'s dead-code check: every function, class, method, attribute and constant defined in specchat/ must be
used somewhere: in specchat/, tests/ or scripts/ (vulture, at 60% confidence and up). Exits 1 naming each one that
is not.

Names that only a framework calls (a torch module's extra_repr, prompt_toolkit's key bindings and history hook,
uvicorn's signal hook, transformers' attributes, a Protocol's keyword names) are listed below, each with its caller.
"""

from __future__ import annotations

import sys
from pathlib import Path

import vulture

ROOT = Path(__file__).resolve().parents[1]
CALLED_BY_FRAMEWORKS = [
    "extra_repr",  # torch.nn.Module.__repr__
    "__getattr__",  # the package's lazy names (PEP 562)
    "store_string",  # prompt_toolkit's FileHistory
    "capture_signals",  # uvicorn's Server
    "writable",  # io.TextIOBase, for transformers' logging stream
    "tie_weights",  # transformers' PreTrainedModel
    "pre_tokenizer",  # tokenizers' Tokenizer
    "num_assistant_tokens",  # transformers' GenerationConfig (assisted generation)
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "original_max_position_embeddings",  # transformers' Phi-3 config
    "num_hidden_layers",  # transformers' configs
    "dropout",  # transformers' attention interface
    "soft",  # prompt_toolkit's prompt_continuation(width, line, soft)
    "skip_special_tokens",  # the Tokenizer protocols' keywords
    "clean_up_tokenization_spaces",
    "add_special_tokens",
]
KEY_BINDINGS = ["@bindings.add"]  # prompt_toolkit calls them


def unused(root: Path = ROOT) -> list[str]:
    """What specchat/ under `root` defines and nothing under `root` uses, one report line each."""
    finder = vulture.Vulture(ignore_names=CALLED_BY_FRAMEWORKS, ignore_decorators=KEY_BINDINGS)
    finder.scavenge([str(root / part) for part in ("specchat", "tests", "scripts") if (root / part).exists()])
    product = root / "specchat"
    found = finder.get_unused_code(min_confidence=60)
    return [item.get_report() for item in found if Path(item.filename).resolve().is_relative_to(product)]


def main() -> int:
    reports = unused()
    for report in reports:
        print(report)
    if reports:
        print(f"{len(reports)} unused in specchat/: remove it, or name its caller in scripts/dead_code.py")
    return 1 if reports else 0


if __name__ == "__main__":
    sys.exit(main())
