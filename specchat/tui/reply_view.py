"""A finished reply seen again: as Markdown with highlighted code (/view markdown), by origin (/view origin),
and its fenced code blocks (/copy). Model text goes through safe_text.visible before any of it is drawn; a
block copied to the clipboard is the exact text, sent only when the user asks for it."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from rich.markdown import Markdown
from rich.text import Text

from specchat.safe_text import visible
from specchat.speculative.events import Token
from specchat.tui.render import MARKS, STYLES

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\n`]*)\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
EXTENSIONS = {
    "python": "py",
    "py": "py",
    "javascript": "js",
    "js": "js",
    "typescript": "ts",
    "bash": "sh",
    "sh": "sh",
    "shell": "sh",
    "c": "c",
    "cpp": "cpp",
    "c++": "cpp",
    "rust": "rs",
    "go": "go",
    "java": "java",
    "json": "json",
    "html": "html",
    "css": "css",
    "sql": "sql",
    "yaml": "yaml",
    "toml": "toml",
}


@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str

    @property
    def extension(self) -> str:
        return EXTENSIONS.get(self.language.lower(), "txt")


def code_blocks(text: str) -> list[CodeBlock]:
    """The fenced code blocks of a reply, in order; a fence a cut reply left open runs to the reply's end."""
    return [
        CodeBlock(match.group(2).strip().split(" ")[0], match.group(3).rstrip("\n")) for match in FENCE.finditer(text)
    ]


def markdown_view(text: str) -> Markdown:
    """The reply as Markdown: headings, lists, code blocks highlighted; links shown as text (no hyperlink escapes)."""
    return Markdown(visible(text), code_theme="monokai", hyperlinks=False)


def origin_view(tokens: list[Token], color: bool) -> Text:
    """The reply's tokens coloured by origin as they streamed, or (colour off) with plain mode's brackets."""
    text, open_mark = Text(), None
    for token in tokens:
        if color:
            text.append(visible(token.text), style=STYLES[token.origin])
            continue
        if token.text and token.origin != open_mark:
            text.append(MARKS[open_mark][1] if open_mark in MARKS else "")
            open_mark = token.origin
            text.append(MARKS.get(open_mark, ("", ""))[0])
        text.append(visible(token.text))
    return text.append(MARKS[open_mark][1] if not color and open_mark in MARKS else "")


class OriginView:
    """origin_view as the console it is drawn on can show it."""

    def __init__(self, tokens: list[Token]):
        self.tokens = tokens

    def __rich_console__(self, console, options):
        yield origin_view(self.tokens, console.color_system is not None)


def osc52(text: str) -> str:
    """The OSC 52 sequence that asks the terminal to put `text` on the clipboard."""
    return f"\x1b]52;c;{base64.b64encode(text.encode('utf-8', 'surrogateescape')).decode('ascii')}\x07"
