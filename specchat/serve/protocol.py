"""The OpenAI chat-completions wire format: requests read and bounded, responses and stream chunks written.

Every field a request may carry is checked here, once, into a `Request`; anything else is a `RequestError` that
the app answers with one JSON error (OpenAI's shape) and an HTTP status, never a traceback. The settings a request
may change (temperature, top_p, top_k, min_p, repeat_penalty, presence_penalty, seed, max_tokens, gamma, drafter) go through the config's own validators,
so the server accepts exactly what the chat accepts. specchat's own fields ride along where clients ignore what
they do not know: `specchat.origins` (which model produced each token) in every chunk, the reply's statistics in
`usage.specchat`.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specchat.config import Config, ConfigError, to_wire
from specchat.serve.tool_calls import ToolError, check_tools, history_message, parse_reply
from specchat.settings import from_mapping
from specchat.speculative.metrics import ReplyStats

MAX_MESSAGES = 4096
MAX_STOPS = 4  # as OpenAI's API
MAX_STOP_CHARS = 256
ROLES = ("system", "user", "assistant", "tool")
# "length": cut before its end (a cap, the window, a loop); clients such as aider then keep the file as it was
FINISH_REASONS = {
    "eos": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "repetition": "length",
}
TOOL_CALLS = "tool_calls"  # the finish reason of a reply that calls tools
# Fields that would change the answer and are not supported yet: refused by name when they ask for anything,
# never silently ignored. Each maps to the values that ask for nothing.
UNSUPPORTED = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "suffix": (None, ""),
    "echo": (None, False),
    "best_of": (None, 1),
}


class RequestError(ValueError):
    """A request the server will not run: its HTTP status and OpenAI's error type."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass(frozen=True)
class Request:
    """One completion request, checked: a chat (messages) or a plain prompt, and the settings it runs with."""

    config: Config  # the server's config with the request's settings applied
    messages: tuple[dict[str, Any], ...] = ()  # a chat (/v1/chat/completions)
    tools: list[dict[str, Any]] | None = None  # for the chat template (tool_calls.py); None: no tools
    json_mode: bool = False  # response_format json_object or json_schema: the reply held to JSON
    json_schema: dict[str, Any] | None = None  # json_schema's schema (None with json_mode: any JSON object)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> amount added to its logit
    frequency_penalty: float = 0.0  # subtracted from a token's logit once per time the reply already holds it
    logprobs: bool = False  # each token's log p under the target's law, in the response
    top_logprobs: int = 0  # and this many likeliest tokens at its place
    prompt: str | None = None  # a plain text prompt (/v1/completions)
    stop: tuple[str, ...] = ()
    stream: bool = False
    max_tokens: int = 0  # 0: as many as the context window leaves
    include: dict[str, bool] = field(default_factory=dict)  # stream_options.include_usage


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def read_chat(body: Any, base: Config) -> Request:
    """A /v1/chat/completions body, checked."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"'messages' holds {len(messages)} messages; at most {MAX_MESSAGES}")
    try:
        checked = tuple(_message(m, i) for i, m in enumerate(messages))
        tools = check_tools(body.get("tools"), body.get("tool_choice"))
    except ToolError as err:
        raise RequestError(str(err)) from None
    if checked[-1]["role"] == "assistant":
        raise RequestError("the last message must be the user's, the system's or a tool's, not the assistant's")
    return _request(body, base, messages=checked, tools=tools)


def read_completion(body: Any, base: Config) -> Request:
    """A /v1/completions body, checked: one prompt string."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be a non-empty string")
    return _request(body, base, prompt=_text(prompt, "prompt"))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _message(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise RequestError(f"messages[{index}] must be an object with 'role' and 'content'")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise RequestError(f"messages[{index}].role must be one of {', '.join(ROLES)}")
    if role == "assistant" and message.get("tool_calls"):
        return history_message({**message, "content": _content(content or "", index)}, index)
    checked: dict[str, Any] = {"role": role, "content": _content(content, index)}
    if role == "tool" and isinstance(message.get("tool_call_id"), str):
        checked["tool_call_id"] = message["tool_call_id"]
    return checked


def _content(content: Any, index: int) -> str:
    if isinstance(content, list):  # content parts: the text ones, joined
        parts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(text, str) for text in parts):
            raise RequestError(f"messages[{index}].content: only text parts are understood")
        content = "".join(parts)  # type: ignore[arg-type]
    if not isinstance(content, str):
        raise RequestError(f"messages[{index}].content must be a string")
    return _text(content, f"messages[{index}].content")


def _text(text: str, name: str) -> str:
    """`text`, refused if it holds a lone surrogate (JSON's \\ud800 escapes allow one; no tokenizer takes it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(
            f"'{name}' holds a lone surrogate (\\u{ord(text[err.start]):04x}) at character {err.start + 1}: not text"
        ) from None
    return text


def _request(body: dict[str, Any], base: Config, **what: Any) -> Request:
    for name, asks_nothing in UNSUPPORTED.items():
        if name in body and not any(body[name] == value for value in asks_nothing):
            raise RequestError(f"'{name}' is not supported by specchat serve yet; send the request without it")
    if body.get("n", 1) != 1:
        raise RequestError("'n' must be 1: the server writes one reply a request")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise RequestError("'max_tokens' must be a positive integer")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object")
    json_mode, json_schema = _response_format(body.get("response_format"))
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError("'logprobs' must be true or false")
    return Request(
        _settings(body, base),
        json_mode=json_mode,
        json_schema=json_schema,
        logit_bias=_logit_bias(body.get("logit_bias")),
        frequency_penalty=_number(body.get("frequency_penalty") or 0.0, "frequency_penalty", 2.0),
        logprobs=logprobs,
        top_logprobs=_top_logprobs(body.get("top_logprobs"), logprobs),
        stop=_stops(body.get("stop")),
        stream=stream,
        max_tokens=max_tokens or 0,
        include={"usage": bool(options.get("include_usage", True))},
        **what,
    )


MAX_TOP_LOGPROBS = 20  # as OpenAI's API


def _top_logprobs(count: Any, logprobs: bool) -> int:
    if count is None or count == 0:
        return 0
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TOP_LOGPROBS:
        raise RequestError(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}")
    if not logprobs:
        raise RequestError("'top_logprobs' needs 'logprobs': true")
    return count


MAX_BIASED = 300  # tokens a logit_bias may name
MAX_BIAS = 100.0


def _logit_bias(bias: Any) -> dict[int, float]:
    """`logit_bias`: {"token id": amount in [-100, 100]}, at most MAX_BIASED tokens."""
    if bias is None:
        return {}
    if not isinstance(bias, dict) or len(bias) > MAX_BIASED:
        raise RequestError(f"'logit_bias' must be an object of at most {MAX_BIASED} 'token id': amount pairs")
    read = {}
    for key, amount in bias.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 10):
            raise RequestError(f"'logit_bias' keys must be token ids, got {key[:20]!r}")
        read[int(key)] = _number(amount, f"logit_bias[{key}]", MAX_BIAS)
    return read


def _number(value: Any, name: str, bound: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -bound <= value <= bound:
        raise RequestError(f"'{name}' must be a number from {-bound:g} to {bound:g}")
    return float(value)


def _response_format(wanted: Any) -> tuple[bool, dict[str, Any] | None]:
    """(JSON mode, its schema) from `response_format`: text, json_object (any object) or json_schema."""
    if wanted is None or wanted == {"type": "text"}:
        return False, None
    kind = wanted.get("type") if isinstance(wanted, dict) else None
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        described = wanted.get("json_schema")
        schema = described.get("schema") if isinstance(described, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("'response_format.json_schema.schema' must be a JSON schema object")
        return True, schema
    raise RequestError("'response_format.type' must be text, json_object or json_schema")


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "seed")


def _settings(body: dict[str, Any], base: Config) -> Config:
    """The server's config with the request's sampling and speculation settings, each validated as the chat does."""
    sampling = {key: body[key] for key in SAMPLING_KEYS if body.get(key) is not None}
    speculation = {key: body[key] for key in ("gamma", "drafter") if body.get(key) is not None}
    if isinstance(sampling.get("temperature"), int) and not isinstance(sampling["temperature"], bool):
        sampling["temperature"] = float(sampling["temperature"])
    for key in ("top_p", "min_p", "repeat_penalty", "presence_penalty"):
        if isinstance(sampling.get(key), int) and not isinstance(sampling[key], bool):
            sampling[key] = float(sampling[key])
    try:
        return from_mapping({"sampling": sampling, "speculation": speculation}, base)
    except ConfigError as err:
        raise RequestError(str(err).replace("sampling.", "").replace("speculation.", "")) from None


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"'stop': at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    return tuple(_text(s, "stop") for s in stops)


# ----- responses ---------------------------------------------------------------------------------------------
TokenOdds = tuple[str, float | None, list[tuple[str, float]]]  # a token's text, its p, the likeliest (text, log p)


@dataclass(frozen=True)
class Reply:
    """What the response needs of one finished reply."""

    text: str
    ids: list[int]
    origins: list[str]
    stop_reason: str
    prompt_tokens: int
    stats: ReplyStats
    tools: frozenset[str] = frozenset()  # the names of the tools the request offered: the text is read for calls
    logprobs: list[TokenOdds] | None = None  # each token's text, target p and likeliest tokens, where asked


UNLIKELY = -9999.0  # the log-probability written for a token whose p is 0 or unknown (as OpenAI writes it)


def logprob_entries(tokens: list[TokenOdds]) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice or a chunk: each token's text, log p under the target's law, its bytes, and
    the likeliest tokens at its place (top_logprobs)."""
    return {
        "content": [
            {**_entry(text, math.log(p) if p else UNLIKELY), "top_logprobs": [_entry(t, lp) for t, lp in alternatives]}
            for text, p, alternatives in tokens
        ]
    }


def _entry(text: str, logprob: float) -> dict[str, Any]:
    finite = logprob if math.isfinite(logprob) and logprob > UNLIKELY else UNLIKELY
    return {"token": text, "logprob": finite, "bytes": list(text.encode("utf-8", errors="replace"))}


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def finish_reason(stop_reason: str) -> str:
    return FINISH_REASONS.get(stop_reason, "stop")


def usage(prompt_tokens: int, stats: ReplyStats) -> dict[str, Any]:
    """OpenAI's usage, with the reply's speculation figures in `specchat`."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": prompt_tokens + stats.new_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},  # KV kept from the last request
        "specchat": {
            "mode": stats.mode,
            "drafter": stats.drafter,
            "gamma": to_wire("speculation.gamma", stats.gamma),
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance": stats.acceptance_rate,
            "tokens_per_target_forward": stats.tokens_per_step,
            "target_forwards": stats.target_forwards,
            "steps": {
                "copied": stats.copied_steps,
                "model_drafted": stats.model_steps,
                "target_only": stats.target_only_steps,
            },
            "prompt_seconds": stats.prefill_s,
            "seconds": stats.wall_s,
            "tokens_per_second": stats.generation_tokens_per_s,
        },
    }


def completion(reply: Reply, model: str, chat: bool) -> dict[str, Any]:
    """The whole response of a request that did not stream."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(reply.stop_reason), "logprobs": None}
    if reply.logprobs is not None:
        choice["logprobs"] = logprob_entries(reply.logprobs)
    parsed = parse_reply(reply.text, reply.tools) if reply.tools else None
    if parsed is not None and parsed.calls:
        choice["message"] = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.calls}
        choice["finish_reason"] = TOOL_CALLS
    elif chat:
        choice["message"] = {"role": "assistant", "content": reply.text}
    else:
        choice["text"] = reply.text
    return {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(reply.prompt_tokens, reply.stats),
        "specchat": {"origins": reply.origins, "token_ids": reply.ids},
    }


@dataclass
class Chunks:
    """The chunks of one streamed response, all under one id."""

    model: str
    chat: bool
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = new_id("chatcmpl" if self.chat else "cmpl")
        self.created = int(time.time())

    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "logprobs": None, **choice}],
            **extra,
        }

    def first(self) -> dict[str, Any]:
        """The chat stream's opening chunk: the role, no text."""
        return self._chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})

    def text(
        self, text: str, ids: list[int], origins: list[str], logprobs: list[TokenOdds] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"delta": {"content": text}} if self.chat else {"text": text}
        if logprobs is not None:
            body["logprobs"] = logprob_entries(logprobs)
        return self._chunk({**body, "finish_reason": None}, specchat={"origins": origins, "token_ids": ids})

    def tool_calls(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """The calls of a reply that made them, in one chunk (each with its index, as OpenAI streams them)."""
        indexed = [{"index": i, **call} for i, call in enumerate(calls)]
        return self._chunk({"delta": {"tool_calls": indexed}, "finish_reason": None})

    def last(
        self, stop_reason: str, prompt_tokens: int, stats: ReplyStats, with_usage: bool, called: bool = False
    ) -> dict[str, Any]:
        body = {"delta": {}} if self.chat else {"text": ""}
        extra = {"usage": usage(prompt_tokens, stats)} if with_usage else {}
        reason = TOOL_CALLS if called else finish_reason(stop_reason)
        return self._chunk({**body, "finish_reason": reason}, **extra)


def streamed_text(sse: str) -> str:
    """The reply's text from a streamed chat response's body (the chunks Chunks writes, as a client reads them)."""
    parts = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[len("data: ") :])["choices"][0]
            parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)
