"""Tools as OpenAI clients use them, through the model's own chat template and its own tool-call markup.

The request's `tools` go to the chat template (the bundled Qwen2.5 template has a tools section; a template with none
is a 400). The model answers a call as Hermes-style markup, as Qwen2.5, Qwen3 and Hermes templates teach it:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`parse_reply` turns each well-formed block into an OpenAI `tool_calls` entry (arguments as a JSON string) and leaves
the text around them as the content; a block that is not JSON of that shape stays text. A small model sometimes
writes the call's JSON without the markup, alone or in a ```json fence (the bundled 1.5B did, asked through
langchain's bind_tools): a reply that is nothing but such an object, or a list of them, naming an offered tool, is
read as its calls too; anything else stays text. History comes back the
other way: an assistant message's `tool_calls` arguments are parsed to objects for the template, `role: "tool"`
messages pass as they are.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from specchat.session.stop_strings import find_stop, held_length

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```"
MAX_TOOLS = 128
MAX_TOOL_JSON = 256 * 1024  # characters of the tools' JSON


class ToolError(ValueError):
    """A request's tools, tool_choice or tool history that the server cannot take."""


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # the text around the calls (None when there is none)
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls entries


def check_tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The tools to render, or None (no tools, or tool_choice "none"); ToolError for what is not supported."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolError("'tool_choice' names a tool, but the request has no 'tools'")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError(f"'tools' must be a list of at most {MAX_TOOLS} function tools")
    if len(json.dumps(tools)) > MAX_TOOL_JSON:
        raise ToolError(f"'tools' is over {MAX_TOOL_JSON:,} characters of JSON")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ToolError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ToolError(f"tools[{index}].function.name must be a non-empty string")
    if tool_choice == "none":
        return None
    if tool_choice not in (None, "auto"):
        raise ToolError("'tool_choice' may be 'auto' or 'none': a forced tool call is not supported yet")
    return tools


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template has a tools section."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def history_message(message: dict[str, Any], index: int) -> dict[str, Any]:
    """An assistant message with `tool_calls`, as the template reads it: each call's arguments as an object."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise ToolError(f"messages[{index}].tool_calls must be a non-empty list")
    read = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ToolError(f"messages[{index}].tool_calls[{number}] must have a function with a name")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            raise ToolError(f"messages[{index}].tool_calls[{number}].function.arguments is not JSON") from None
        read.append(
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return {"role": "assistant", "content": message.get("content") or "", "tool_calls": read}


def parse_reply(text: str, tool_names: frozenset[str] = frozenset()) -> ParsedReply:
    """The reply's tool calls (each a well-formed block) and the text around them; with no block, a reply that is
    only a call's JSON naming one of `tool_names`."""
    calls, kept, last = [], [], 0
    for start, end in _blocks(text):
        call = _call(text[start + len(OPEN) : end - len(CLOSE)].strip())
        if call is None:
            continue
        kept.append(text[last:start])
        last = end
        calls.append(call)
    kept.append(text[last:])
    if not calls:
        bare = _bare_calls(text, tool_names)
        return ParsedReply(None, bare) if bare else ParsedReply(text or None)
    return ParsedReply("".join(kept).strip() or None, calls)


def _blocks(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each <tool_call>...</tool_call> block, the markup included; a scan by str.find, linear in the
    text (a regex with whitespace on both sides of a lazy group backtracked for seconds on a run of spaces)."""
    start = text.find(OPEN)
    while start >= 0:
        close = text.find(CLOSE, start + len(OPEN))
        if close < 0:
            return
        end = close + len(CLOSE)
        yield start, end
        start = text.find(OPEN, end)


def _unfenced(body: str) -> str:
    """A ```json fence's inside (or the text as it is where it is not one fence)."""
    if len(body) < 2 * len(FENCE) or not (body.startswith(FENCE) and body.endswith(FENCE)):
        return body
    inside = body[len(FENCE) : -len(FENCE)]
    return inside.removeprefix("json").strip()


def _bare_calls(text: str, tool_names: frozenset[str]) -> list[dict[str, Any]]:
    """The calls of a reply that is nothing but a call's JSON (or a list of them), fenced or not, naming offered
    tools; [] otherwise."""
    value = _json(_unfenced(text.strip()))
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, dict) and i.get("name") in tool_names and "arguments" in i for i in items):
        return []
    return [_entry(item) for item in items]


def _json(text: str) -> Any:
    """The JSON value of a model's text, or None (not JSON, or nested past Python's recursion limit)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _call(body: str) -> dict[str, Any] | None:
    call = _json(body)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    return _entry(call)


def _entry(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's tool_calls entry of a call the model wrote ({"name", "arguments"}; "parameters" as some write it)."""
    arguments = call.get("arguments", call.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def shown_before_calls(text: str) -> str:
    """Of a streaming reply's text, what may be sent as content now: everything before the first call's markup
    (and before an end of text that may still grow into it); nothing yet of a reply that opens as JSON or a fence,
    which may turn out to be a bare call."""
    opening = text.lstrip()
    if opening[:1] == "{" or opening.startswith(FENCE) or (opening and FENCE.startswith(opening)):
        return ""
    at = find_stop(text, (OPEN,))
    return text[:at] if at is not None else text[: len(text) - held_length(text, (OPEN,))]


def tool_names(tools: list[dict[str, Any]] | None) -> frozenset[str]:
    return frozenset(tool["function"]["name"] for tool in tools or [])
