"""Between two tokenizers: the committed conversation in a drafter's own ids, and drafted text in the target's.

`TextMirror` keeps the committed target ids as the drafter's ids: their text (special tokens kept as their
text, so a drafter that knows them reads them as its own) encoded by the drafter's tokenizer. A step changes
only the end of the text, so the decode reads a short window of the newest ids and the encode starts again
at the start of the last line that changed. Encoding line by line gives the ids that encoding the whole
text gives for tokenizers that never join a line start to the text before it (byte-level BPE: GPT-2,
Llama 3, Qwen); one that does (SentencePiece's dummy-prefix space) is found by a probe once and re-encodes
the whole text each step instead.

`continuation_ids` re-tokenizes drafted text after the committed text's tail, keeping only the ids the
draft adds; which ids those are is all that matters here: the target verifies every one of them.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

WINDOW = 8  # newest committed ids decoded again to see the text new ids add
REPLACEMENT = "\ufffd"  # what a decode shows for a character whose bytes are not all there yet
LINE_START = re.compile(r"\n(?=\S)")  # a line that starts with no whitespace: where no tokenizer joins pieces
PROBE = "Hello world.\nfor i in range(3):\n    print(i * 2)\n\nThe end, 2 + 2 = 4.\n"


class TextTokenizer(Protocol):
    """What re-tokenizing needs of a tokenizer (a transformers tokenizer has it all)."""

    @property
    def added_tokens_decoder(self) -> Mapping[int, Any]: ...  # id -> AddedToken (.content, .special)

    @property
    def all_special_tokens(self) -> list[str]: ...

    @property
    def bos_token(self) -> Any: ...  # its text (a str) where bos_token_id is set

    def convert_tokens_to_ids(self, token: str) -> Any: ...

    def decode(
        self, ids: list[int], *, skip_special_tokens: bool = ..., clean_up_tokenization_spaces: bool = ...
    ) -> str: ...

    def __call__(self, text: Any, *, add_special_tokens: bool = ...) -> Any: ...

    def __len__(self) -> int: ...


Item = TypeVar("Item")


def common_prefix(a: Sequence[Item], b: Sequence[Item]) -> int:
    """How many leading items (ids or characters) a and b share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def decode(tokenizer: TextTokenizer, ids: list[int]) -> str:
    """The text of ids as it is: special tokens kept, spacing not cleaned up."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids, with no BOS or EOS added (special tokens written in the text are read as such)."""
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def special_tokens(tokenizer: TextTokenizer) -> dict[str, int]:
    """Every special token the tokenizer knows, as token -> id."""
    found: dict[str, int] = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for token in tokenizer.all_special_tokens:
        found.setdefault(token, tokenizer.convert_tokens_to_ids(token))
    return found


def line_starts(text: str, after: int) -> list[int]:
    """Offsets past `after` where a line starts with something other than whitespace."""
    return [m.end() for m in LINE_START.finditer(text, after)]


def splits_at_lines(tokenizer: TextTokenizer) -> bool:
    """Whether encoding a text line by line gives the ids of encoding it whole."""
    starts = [0, *line_starts(PROBE, 0)]
    pieces = [PROBE[a:b] for a, b in zip(starts, starts[1:] + [len(PROBE)])]
    (whole,) = encode(tokenizer, [PROBE])
    return whole == [i for ids in encode(tokenizer, pieces) for i in ids]


def bos_prefix(tokenizer: TextTokenizer) -> list[int]:
    """[BOS] for a tokenizer that opens ordinary text with it (Llama does, GPT-2 and Qwen do not), else []."""
    bos: int | None = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None and tokenizer("a")["input_ids"][:1] == [bos] else []


def continuation_ids(tokenizer: TextTokenizer, tail: str, text: str) -> list[int]:
    """The ids `text` adds after the committed text's `tail`. Where the draft's start merges with the tail's
    last token (the tail ends inside a word), those ids would say committed text again: the draft's own ids."""
    if not text:
        return []
    alone, joined = encode(tokenizer, [tail, tail + text])
    if joined[: len(alone)] == alone:
        return joined[len(alone) :]
    return encode(tokenizer, [text])[0]


class TextMirror:
    """The committed target ids as the drafter's ids (`update`)."""

    def __init__(self, target_tokenizer: TextTokenizer, drafter_tokenizer: TextTokenizer) -> None:
        self.target_tokenizer, self.drafter_tokenizer = target_tokenizer, drafter_tokenizer
        self.by_line = splits_at_lines(drafter_tokenizer)
        self.bos = bos_prefix(drafter_tokenizer)
        self.bos_text: str = drafter_tokenizer.bos_token if self.bos else ""
        self.reset()

    def reset(self) -> None:
        self.target_ids: list[int] = []
        self.text = ""  # decode(target_ids)
        self.ids: list[int] = []  # the text in the drafter's ids
        self.lines = [0]  # where each encoded piece of the text starts
        self.firsts = [0]  # the index in ids of each piece's first id

    def update(self, target_ids: list[int]) -> list[int]:
        """The drafter's ids for the committed target ids."""
        self._encode_from(self._read(target_ids))
        opens = self.bos and not self.text.startswith(self.bos_text)
        return (self.bos if opens else []) + self.ids

    def _read(self, target_ids: list[int]) -> int:
        """Take target_ids as the committed ids; how many leading characters of the text stayed the same."""
        grown = self._grown(target_ids) if target_ids[: len(self.target_ids)] == self.target_ids else None
        if grown is None:
            text = decode(self.target_tokenizer, target_ids)
            grown = text, common_prefix(self.text, text)
        self.target_ids, (self.text, keep) = list(target_ids), grown
        return keep

    def _grown(self, target_ids: list[int]) -> tuple[str, int] | None:
        """(text, characters kept) for ids that extend the committed ones, from a window of the newest ids;
        None where the window's text does not extend the text (then the whole is decoded)."""
        base = max(0, len(self.target_ids) - WINDOW)
        before = decode(self.target_tokenizer, self.target_ids[base:])
        after = decode(self.target_tokenizer, target_ids[base:])
        settled = before.rstrip(REPLACEMENT)  # an unfinished character may still change
        if not (self.text.endswith(before) and after.startswith(settled)):
            return None
        keep = len(self.text) - len(before) + len(settled)
        return self.text[:keep] + after[len(settled) :], keep

    def _encode_from(self, keep: int) -> None:
        """Encode the text again from the start of the line that holds its first changed character."""
        piece = max(0, bisect.bisect_left(self.lines, keep) - 1) if self.by_line else 0
        start = self.lines[piece]
        del self.ids[self.firsts[piece] :], self.lines[piece:], self.firsts[piece:]
        starts = [start, *line_starts(self.text, start)] if self.by_line else [0]
        ends = starts[1:] + [len(self.text)]
        for offset, ids in zip(starts, encode(self.drafter_tokenizer, [self.text[a:b] for a, b in zip(starts, ends)])):
            self.lines.append(offset)
            self.firsts.append(len(self.ids))
            self.ids.extend(ids)
