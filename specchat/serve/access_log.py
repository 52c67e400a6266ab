"""One line a request on the server's stderr: the route, the status and, for a reply, what it did.

POST /v1/chat/completions 200 · 29+48 tokens · eos · acceptance 80% · steps 0 copied/15 model/0 target-only · 0.96 s
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from specchat.safe_text import visible
from specchat.speculative.metrics import ReplyStats

AccessLog = Callable[[str], None]
PATH_CHARS = 120  # of a request's path shown


def access_line(
    method: str,
    path: str,
    status: int,
    seconds: float | None = None,
    prompt_tokens: int | None = None,
    stop_reason: str = "",
    stats: ReplyStats | None = None,
    note: str = "",
) -> str:
    """The access-log line of one request (the path shown through safe_text.visible: a client wrote it)."""
    parts = [f"{time.strftime('%H:%M:%S')} {method} {visible(path[:PATH_CHARS])} {status}"]
    if stats is not None:
        parts.append(f"{prompt_tokens}+{stats.new_tokens} tokens")
        parts.append(stop_reason)
        if stats.drafted:
            parts.append(f"acceptance {stats.acceptance_rate:.0%}")
        parts.append(
            f"steps {stats.copied_steps} copied/{stats.model_steps} model/{stats.target_only_steps} target-only"
        )
    if note:
        parts.append(note)
    if seconds is not None:
        parts.append(f"{seconds:.2f} s")
    return " · ".join(parts)


def to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
