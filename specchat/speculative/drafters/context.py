"""The drafter's view of a long conversation: its start and its newest tokens, the middle left out.

Reading a pasted file costs the bundled drafter about 40% of what it costs the target, and its guesses need
the instruction and the text near the reply far more than the middle of a long file, which prompt-lookup
copies still see whole (they read the committed ids, not the drafter's cache). With
`speculation.drafter_context` = N, a conversation longer than N tokens reaches the drafter's cache as its
first N/4 tokens and its last 3N/4, with one gap between them; later turns add to the cache after the gap, and
one that brings more than N new tokens (another paste) has the drafter read the chat's start and end anew.
Only the drafter's proposals change; the target verifies them as ever, so the reply stays exactly the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_GAP = 64  # a gap shorter than this saves too little to be worth a drafter that sees less


@dataclass
class ContextGap:
    """ids[start:start + count] are not in the drafter's cache (count 0: no gap)."""

    start: int = 0
    count: int = 0

    def seen(self, cached: int) -> int:
        """Committed ids the cache stands for: those it holds, plus the gap once the cache has reached it."""
        return cached + self.count if self.count and cached >= self.start else cached

    def open(self, limit: int, total: int, seen: int) -> None:
        """Plan a gap in ids[seen:total] when a conversation of `total` ids is longer than `limit` (0: never).
        One gap at most: a longer conversation later keeps the first one."""
        if not limit or self.count or total <= limit:
            return
        head = limit // 4
        start, end = max(seen, head), total - (limit - head)
        if end - start >= MIN_GAP:
            self.start, self.count = start, end - start

    def cut(self, keep: int) -> int:
        """The cache length that stands for the first `keep` committed ids. A cut before the gap's end
        closes the gap (what followed it is read again, and may open a new one)."""
        if not self.count:
            return keep
        if keep >= self.start + self.count:
            return keep - self.count
        cached = min(keep, self.start)
        self.start, self.count = 0, 0
        return cached
