"""Text from a model, a file or the keyboard is data: it never drives the terminal.

`visible(text)` is what every view draws. Each control character a terminal would act on is shown as
a visible escape instead, so only specchat's own colours and cursor moves reach the terminal:

- C0 controls other than newline and tab, in caret notation, as `cat -v` and a terminal's echo show
  them: ESC is `^[`, BEL `^G`, CR `^M`, NUL `^@`;
- DEL (0x7f) as `^?`;
- C1 controls (0x80-0x9f, e.g. the one-character CSI) as `\\x9b`;
- a lone surrogate (a byte the terminal could not decode, kept by surrogateescape) as U+FFFD, since
  a UTF-8 terminal's stream raises on one;
- the characters that reorder or hide text ("Trojan Source" spoofing) as `<U+202E>`: the bidi embeddings,
  overrides and isolates (U+202A-U+202E, U+2066-U+2069), the zero-width space and word joiner, the byte-order
  mark, U+180E and the line and paragraph separators (U+2028, U+2029). The joiners U+200C and U+200D and the
  marks U+200E, U+200F stay as they are: Persian, Indic scripts, emoji sequences and right-to-left text need them.

So a reply spelling `ESC [2J` shows `^[[2J`, and an OSC 52 clipboard write shows as text. Files keep
the exact text: `json_text` writes JSON whose strings escape every C0, DEL and C1 character
(`\\u001b`, `\\u009b`), every lone surrogate and every character that reorders or hides text (`\\u202e`), so
the file is exact, UTF-8 and safe to `cat`.
"""

from __future__ import annotations

import json
import re
from typing import Any

HIDDEN_ORDER = "\u202a-\u202e\u2066-\u2069\u200b\u2060\ufeff\u180e\u2028\u2029"  # shown as <U+XXXX>
UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff{HIDDEN_ORDER}]")
JSON_RAW_CONTROLS = re.compile(f"[\x7f-\x9f\ud800-\udfff{HIDDEN_ORDER}]")  # json.dumps escapes C0 itself,
# not these when ensure_ascii is off; a lone surrogate escaped as \udcff reads back as itself, the file stays UTF-8


def shown_as(char: str) -> str:
    """The visible form of one control character or lone surrogate."""
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"<U+{code:04X}>"


def visible(text: str) -> str:
    """`text` as a terminal may show it: control characters as visible escapes (see the module doc)."""
    return UNSAFE.sub(lambda match: shown_as(match.group()), text)


def json_text(data: Any, **dumps_options) -> str:
    """json.dumps keeping non-ASCII text readable, with every control character in a string escaped."""
    text = json.dumps(data, ensure_ascii=False, **dumps_options)
    return JSON_RAW_CONTROLS.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
