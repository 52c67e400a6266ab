"""Text from a model, a file or the keyboard is data: it never drives the terminal.

`visible(text)` is what every view draws. Each control character a terminal would act on is shown as
a visible escape instead, so only specchat's own colours and cursor moves reach the terminal:

- C0 controls other than newline and tab, in caret notation, as `cat -v` and a terminal's echo show
  them: ESC is `^[`, BEL `^G`, CR `^M`, NUL `^@`;
- DEL (0x7f) as `^?`;
- C1 controls (0x80-0x9f, e.g. the one-character CSI) as `\\x9b`;
- a lone surrogate (a byte the terminal could not decode, kept by surrogateescape) as U+FFFD, since
  a UTF-8 terminal's stream raises on one.

So a reply spelling `ESC [2J` shows `^[[2J`, and an OSC 52 clipboard write shows as text. Files keep
the exact text: `json_text` writes JSON whose strings escape every C0, DEL and C1 character
(`\\u001b`, `\\u009b`) and every lone surrogate, so the file is exact, UTF-8 and safe to `cat`.
"""

from __future__ import annotations

import json
import re
from typing import Any

TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f\ud800-\udfff]")  # json.dumps escapes C0 itself, not these when
# ensure_ascii is off; a lone surrogate escaped as \udcff reads back as itself, and the file stays UTF-8


def shown_as(char: str) -> str:
    """The visible form of one control character or lone surrogate."""
    code = ord(char)
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return f"\\x{code:02x}"
    return "\ufffd"


def visible(text: str) -> str:
    """`text` as a terminal may show it: control characters as visible escapes (see the module doc)."""
    return TERMINAL_CONTROLS.sub(lambda match: shown_as(match.group()), text)


def json_text(data: Any, **dumps_options) -> str:
    """json.dumps keeping non-ASCII text readable, with every control character in a string escaped."""
    text = json.dumps(data, ensure_ascii=False, **dumps_options)
    return JSON_RAW_CONTROLS.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
