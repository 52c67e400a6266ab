"""Incremental detokenization: text deltas whose concatenation equals decode(ids).

decode skips special tokens (an end-of-turn marker is not reply text).

Each push decodes only a short window, as text-generation-inference and mlx-lm's streaming
detokenizers do: the tokens emitted last (context, so a tokenizer that drops a leading space at the
start of a decode still joins words right) plus the tokens not yet emitted. The delta is the
window's text beyond the text of its context tokens, so a reply costs linear time, not quadratic.

A multi-byte character split across tokens decodes to U+FFFD until its last byte arrives; such a
tail is held back, so no replacement character ever reaches the screen mid-stream.

For byte-level BPE and SentencePiece tokenizers, whose decode of a longer id list extends the decode
of a shorter one, the deltas concatenate exactly to decode(ids). A tokenizer whose decode rewrites
earlier text (WordPiece's clean-up: "don ' t" -> "don't") cannot take back what was shown; the
stream then goes on from the first character that differs.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"
HOLD_LIMIT = 8  # tokens held at most while the text ends in U+FFFD (a character is at most 4 bytes)


class Tokenizer(Protocol):
    """What the engine needs of a tokenizer: its size and its decode (a transformers tokenizer has both)."""

    def __len__(self) -> int: ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._start = 0  # first id of the window: the context tokens begin here
        self._read = 0  # first id not yet emitted
        self._context_text = ""  # decode(ids[_start:_read])

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it makes visible ('' while a character is incomplete)."""
        self.ids.append(token_id)
        text = self.decode(self.ids[self._start :])
        if not text.endswith(REPLACEMENT):
            return self._emit(len(self.ids), text)
        if len(self.ids) - self._read <= HOLD_LIMIT:
            return ""
        return self._emit_resolved(text)

    def flush(self) -> str:
        """Whatever is held back (an incomplete tail at the end of a reply), now final."""
        if self._read == len(self.ids):
            return ""
        return self._emit(len(self.ids), self.decode(self.ids[self._start :]))

    @property
    def text(self) -> str:
        return self.decode(self.ids)

    def _emit(self, end: int, text: str) -> str:
        """Emit ids[_read:end], whose window text is `text`; they become the next window's context."""
        shown = self._context_text
        same = len(shown) if text.startswith(shown) else _common_prefix_len(shown, text)
        self._start, self._read = self._read, end
        self._context_text = self.decode(self.ids[self._start : self._read])
        return text[same:]

    def _emit_resolved(self, text: str) -> str:
        """Held too long, so the text holds a real U+FFFD: emit up to the newest token boundary whose
        text can no longer change. That is one whose text is a prefix of the window's text with more
        text after it: the decoder has moved past whatever bytes were open at the boundary."""
        for end in range(len(self.ids) - 1, self._read, -1):
            head = self.decode(self.ids[self._start : end])
            if text.startswith(head) and len(text) > len(head):
                return self._emit(end, head)
        return ""


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
