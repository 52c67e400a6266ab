"""specchat: exact speculative decoding you can see and tune, from a terminal chat or from Python.

    import specchat
    result = specchat.speculative_generate(input_ids, drafter, target, tokenizer, gamma=4)
    result.ids, result.text, result.acceptance_rate, result.stats, result.tokens  # (id, text, origin)
    ids, alpha = result                                        # as the research repos return

Public names: speculative_generate, autoregressive_generate, stream, load_pair, Generation, and the
events stream() yields: Token (id, text, origin: an Origin), Rejected, StepDone, ReplyDone.
The chat itself: `python infer.py` (see the README).

Importing specchat changes nothing in the process: no environment variable, and torch loads only when a public
name is first used. The programs (the chat, the server, the bench) set OpenMP's wait policy first (threads.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specchat.api import Generation, autoregressive_generate, load_pair, speculative_generate, stream
    from specchat.speculative.events import Origin, Rejected, ReplyDone, StepDone, Token

__all__ = [
    "speculative_generate",
    "autoregressive_generate",
    "stream",
    "load_pair",
    "Generation",
    "Origin",
    "Token",
    "Rejected",
    "StepDone",
    "ReplyDone",
]
_EVENTS = ("Origin", "Token", "Rejected", "StepDone", "ReplyDone")
_HOMES = {name: "specchat.speculative.events" if name in _EVENTS else "specchat.api" for name in __all__}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'specchat' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
