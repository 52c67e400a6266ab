"""Prompt lookup: guess the next tokens by copying what followed an earlier occurrence of the newest ones.

Chats about code repeat themselves: a follow-up turn re-prints the function it edits, a reply quotes
the prompt's names. The drafter feeds such a guess together with its current token in one forward
and keeps the guessed tokens it would have drafted anyway (see drafters.py), so a guess does not
change what is drafted (up to the rounding of a batched forward), only how many drafter forwards it
takes (speculation.prompt_lookup). Measured neutral on the bench prompts of an earlier release; on with the
auto drafter's doubling copies in the bundled config since they measured ahead together (mixed.py).
"""

from __future__ import annotations

from typing import Protocol

MIN_NGRAM = 3  # the newest tokens must have occurred before at least this long
MAX_NGRAM = 8  # a match this long is taken at once
WINDOW = 4096  # how far back to look
MAX_GUESS = 3  # guessed tokens per drafter forward: on a CPU a forward over 4 tokens costs about
# one over 1 token (int8 0.5B drafter: 39 vs 36 ms), over 7 tokens almost two


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def match_length(ids: list[int], end: int, limit: int) -> int:
    """How many tokens ending at `end` equal the newest tokens of ids (at most `limit`)."""
    n = 0
    while n < limit and end - n >= 0 and ids[end - n] == ids[-1 - n]:
        n += 1
    return n


def match_start(
    ids: list[int], min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM, window: int = WINDOW
) -> int | None:
    """Where what followed the longest (then latest) earlier match of ids' newest tokens begins, or None."""
    if len(ids) <= min_ngram:
        return None
    newest, lowest = ids[-1], max(0, len(ids) - 1 - window)
    best_n, best_end = 0, -1
    for end in range(len(ids) - 2, lowest - 1, -1):
        if ids[end] != newest:
            continue
        n = match_length(ids, end, min(max_ngram, end + 1))
        if n > best_n:
            best_n, best_end = n, end
            if n == max_ngram:
                break
    return best_end + 1 if best_n >= min_ngram else None


def continuation(
    ids: list[int], k: int, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM, window: int = WINDOW
) -> list[int]:
    """Up to k tokens that followed the longest (then latest) earlier match of ids' newest tokens."""
    start = match_start(ids, min_ngram, max_ngram, window) if k > 0 else None
    return [] if start is None else ids[start : start + k]


class Guesser(Protocol):
    def guess(self, ids: list[int], drafted: list[int], room: int) -> list[int]: ...


class NoGuess:
    """No prompt lookup: every drafter forward feeds only the current token."""

    def guess(self, ids: list[int], drafted: list[int], room: int) -> list[int]:
        return []


class PromptLookup:
    """Up to MAX_GUESS tokens copied from what followed the newest n-gram earlier in the conversation."""

    def guess(self, ids: list[int], drafted: list[int], room: int) -> list[int]:
        if room <= 0:
            return []
        return continuation(ids[-WINDOW:] + drafted, min(room, MAX_GUESS))
