"""specchat: exact speculative decoding you can see and tune, from a terminal chat or from Python.

    import specchat
    result = specchat.speculative_generate(input_ids, drafter, target, tokenizer, gamma=4)
    result.ids, result.text, result.acceptance_rate, result.stats, result.tokens  # (id, text, origin)
    ids, alpha = result                                        # as the research repos return

Public names: speculative_generate, autoregressive_generate, stream, load_pair, Generation, and the
events stream() yields: Token (id, text, origin: an Origin), Rejected, StepDone, ReplyDone.
The chat itself: `python infer.py` (see the README).
"""

from specchat.threads import set_wait_policy

set_wait_policy()  # before torch is imported (specchat/threads.py)

from specchat.api import Generation, autoregressive_generate, load_pair, speculative_generate, stream  # noqa: E402
from specchat.speculative.events import Origin, Rejected, ReplyDone, StepDone, Token  # noqa: E402

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
