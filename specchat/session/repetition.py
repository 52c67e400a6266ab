"""A reply stuck in a loop (one emoji, one line, over and over) would run on to the context window: the session
ends it once its newest tokens have repeated one span back to back over `sampling.repetition_stop` tokens (64 by
default) and at least REPEATS times, with the stop reason "repetition" and a mark. A span of one token must run 64
times, so a request to repeat a word 50 times is written whole; a longer span is caught after REPEATS repeats or 64
tokens, whichever is later. The engine is halted through its cancel flag, as at a stop string: its caches stay."""

from __future__ import annotations

REPETITION = "repetition"  # the stop reason
REPEATS = 8  # a span must be repeated back to back at least this many times
MAX_SPAN = 64  # the longest span looked for, in tokens


def repeated_span(ids: list[int], run: int, repeats: int = REPEATS, max_span: int = MAX_SPAN) -> int:
    """The length of a span that the end of `ids` repeats back to back over max(run, repeats × span) tokens, or 0."""
    for span in range(1, min(max_span, len(ids) // repeats) + 1):
        if ids[-1] != ids[-1 - span]:  # most spans fail here, at one comparison
            continue
        tail = ids[-max(run, repeats * span) :]
        if len(tail) >= max(run, repeats * span) and tail[span:] == tail[:-span]:
            return span
    return 0


class RepetitionGuard:
    """One reply's token ids, and whether they have fallen into a loop (`run` 0: never)."""

    def __init__(self, run: int):
        self.run = run
        self.ids: list[int] = []
        self.looping = False

    def add(self, token_id: int) -> bool:
        """Take the reply's next token; True once it is looping."""
        self.ids.append(token_id)
        if self.run and not self.looping:
            self.looping = repeated_span(self.ids, self.run) > 0
        return self.looping
