"""A process-wide patch that overlapping blocks (two threads loading at once) share: put in by the first block to
enter, taken out by the last to leave, so it is never left in place (metadata.py's quick reader, tensors.py's name
map built once)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class SharedPatch:
    def __init__(self, apply: Callable[[], None], undo: Callable[[], None]):
        self._apply, self._undo = apply, undo
        self._lock = threading.Lock()
        self._users = 0  # blocks inside held() now, in any thread

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._apply()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._undo()
