"""/trace: each token of the last reply (or of the session) as one JSON line, for plotting.

One line per token, in order: {"reply", "step", "pos", "id", "text", "origin", "source", "p", "q",
"accept_p"}. origin is drafted | corrected | bonus | target | drafter, or rejected for the first draft of
a step the target refused (it comes before the corrected token at the same pos; drafts after it were
never judged and are not listed). source says what drafted a drafted or rejected token: model (the
drafter model), lookup (a copy from the conversation) or text (a drafter model of another tokenizer, its text
re-tokenized); null for the others. p, q and accept_p are null
where a model did not score the token. The text is exact, every control character JSON-escaped
(safe_text.json_text). The file is written 0600 and never over an existing one unless the command was
`/trace!`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from specchat.fileio import write_text_atomic
from specchat.safe_text import json_text
from specchat.session.chat import ChatError, ChatSession, ReplyRecord
from specchat.speculative.events import Origin

USAGE = "usage /trace PATH.jsonl (the last reply) or /trace all PATH.jsonl (the whole session)"


def record_lines(reply: int, record: ReplyRecord, tokenizer) -> Iterator[dict]:
    refused = {r.step: r for r in record.rejections}
    for token in record.tokens:
        rejection = refused.get(token.step) if token.origin == Origin.CORRECTED else None
        if rejection is not None:
            yield {
                "reply": reply,
                "step": token.step,
                "pos": rejection.position,
                "id": rejection.drafted,
                "text": tokenizer.decode([rejection.drafted]),
                "origin": "rejected",
                "source": rejection.source or None,
                "p": rejection.p,
                "q": rejection.q,
                "accept_p": rejection.accept_p if rejection.accept_p is not None else 0.0,
            }
        yield {
            "reply": reply,
            "step": token.step,
            "pos": token.position,
            "id": token.id,
            "text": token.text,
            "origin": token.origin.value,
            "source": token.source or None,
            "p": token.odds.p,
            "q": token.odds.q,
            "accept_p": token.odds.accept_p,
        }


def parse_trace_arg(arg: str) -> tuple[bool, Path]:
    words = arg.split(maxsplit=1)
    whole = len(words) == 2 and words[0] == "all"
    text = words[1] if whole else arg.strip()
    if not text or not text.lower().endswith(".jsonl"):
        raise ChatError(USAGE)
    try:
        return whole, Path(text).expanduser()
    except RuntimeError as err:  # ~user when there is no such user
        raise ChatError(f"cannot write '{text}': {err}") from None


def write_trace(session: ChatSession, arg: str, overwrite: bool = False) -> tuple[Path, int]:
    """Write the trace `arg` asks for, atomically, over an existing file only when `overwrite` (the
    command was /trace!); returns (path, lines written)."""
    whole, path = parse_trace_arg(arg)
    if not session.records:
        raise ChatError("no reply yet")
    first = 0 if whole else len(session.records) - 1
    lines = [
        json_text(line)
        for reply in range(first, len(session.records))
        for line in record_lines(reply + 1, session.records[reply], session.tokenizer)
    ]
    try:
        write_text_atomic(path, "".join(f"{line}\n" for line in lines), overwrite)
    except FileExistsError:
        raise ChatError(f"{path} exists; use /trace! {arg.strip()} to overwrite") from None
    except (OSError, ValueError) as err:
        raise ChatError(f"cannot write '{path}': {getattr(err, 'strerror', None) or err}") from None
    return path, len(lines)
