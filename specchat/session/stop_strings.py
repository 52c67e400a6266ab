"""Stop strings: a reply ends where its text begins one (a base model starting the next "User:" turn).

The engine's events pass through a StopFilter. Text that may still turn out to be the start of a
stop string is held back, with every event after it, until the next tokens tell; then it is
released, or the reply is cut where the stop string begins and nothing from there on is passed.
The engine itself is halted through its cancel flag, so its caches stay as after any cancel.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from specchat.speculative.events import ReplyDone, Token

STOP_STRING = "stop_string"  # the stop reason of a reply cut at a stop string


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the first stop string in `text` begins, or None."""
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return min(found) if found else None


def held_length(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that some stop string begins with: text that may
    still become a stop string, so must not be shown yet."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class StopOrCancel:
    """The cancel flag the engine polls: set by the user's cancel, or by the session at a stop string."""

    def __init__(self, cancel: threading.Event):
        self.cancel = cancel
        self.stopped = threading.Event()

    def is_set(self) -> bool:
        return self.cancel.is_set() or self.stopped.is_set()


class StopFilter:
    """One reply's events, passed on in order, cut at the first stop string in the tokens' text."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(stop for stop in stops if stop)
        self.held: list[Any] = []  # events waiting for the text after them
        self.kept: list[Token] = []  # the tokens passed on so far
        self.cut = False  # a stop string was found: the reply ends before it

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.kept)

    def feed(self, event: Any) -> list[Any]:
        """The events to pass on now that the engine sent `event` (none once the reply is cut)."""
        if isinstance(event, ReplyDone):
            return self._end(event)
        if self.cut:
            return []
        self.held.append(event)
        held_text = "".join(e.text for e in self.held if isinstance(e, Token))
        at = find_stop(held_text, self.stops)
        if at is not None:
            return self._cut_at(at)
        return self._release_before(len(held_text) - held_length(held_text, self.stops))

    def _release_before(self, safe: int) -> list[Any]:
        """Release the held events up to the first token whose text reaches past `safe` characters."""
        offset, count = 0, 0
        for event in self.held:
            if isinstance(event, Token):
                if offset + len(event.text) > safe:
                    break
                offset += len(event.text)
            count += 1
        return self._release(self.held[:count], count)

    def _cut_at(self, at: int) -> list[Any]:
        """Release what comes before the stop string that begins `at` characters into the held text: a
        token it begins inside keeps its part before it; the events after the last kept token go."""
        out, offset, last_token = [], 0, 0
        for event in self.held:
            if isinstance(event, Token):
                if offset >= at:
                    break
                offset += len(event.text)
                if offset > at:
                    event = dataclasses.replace(event, text=event.text[: len(event.text) - (offset - at)])
                last_token = len(out) + 1
            out.append(event)
        self.cut = True
        return self._release(out[:last_token], len(self.held))

    def _release(self, out: list[Any], consumed: int) -> list[Any]:
        self.held = self.held[consumed:]
        self.kept.extend(event for event in out if isinstance(event, Token))
        return out

    def _end(self, done: ReplyDone) -> list[Any]:
        """At the engine's end: the held events, all shown (no stop string came), or the reply as cut."""
        if not self.cut:
            return self._release(list(self.held), len(self.held)) + [done]
        ids = tuple(token.id for token in self.kept)
        return [dataclasses.replace(done, text=self.text, ids=ids, stop_reason=STOP_STRING)]
