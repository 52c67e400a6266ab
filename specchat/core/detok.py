"""Incremental detokenization: text deltas whose concatenation equals decode(ids).

decode skips special tokens (an end-of-turn marker is not reply text).

A multi-byte character split across tokens decodes to U+FFFD until its last byte arrives; such a
tail is held back, so no replacement character ever reaches the screen mid-stream.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = ""

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _decode(self) -> str:
        return self.decode(self.ids)

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it makes visible ('' while a character is incomplete)."""
        self.ids.append(token_id)
        text = self._decode()
        if text.endswith(REPLACEMENT) or not text.startswith(self._emitted):
            return ""
        delta = text[len(self._emitted):]
        self._emitted = text
        return delta

    def flush(self) -> str:
        """Whatever decode(ids) holds beyond what was emitted (a held tail at the end of a reply)."""
        text = self._decode()
        if not text.startswith(self._emitted):
            return ""
        delta = text[len(self._emitted):]
        self._emitted = text
        return delta

    @property
    def text(self) -> str:
        return self._decode()
