"""The HTTP routes (Starlette): /v1/chat/completions, /v1/completions, /v1/models[/{id}], /health.

Each reply runs on a worker thread of its own (the engine is synchronous); its events reach the response
through an asyncio queue. A streamed reply is sent as server-sent events, one chunk per decoding step (its
tokens' text, ids and origins); a client that goes away sets the reply's cancel flag, which the engine reads
after the step in flight. Bodies are read to at most `max_body` bytes; with an API key every route but /health
asks for it (`Authorization: Bearer KEY`). Every route sits behind guard.py (Host, Origin, content type); every
answer, errors included, is OpenAI-shaped JSON; every request is one line in the access log (access_log.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specchat.config import Config
from specchat.memory import resident_bytes
from specchat.serve.access_log import AccessLog, access_line, to_stderr
from specchat.serve.guard import Guard, Guarded
from specchat.serve.protocol import (
    Chunks,
    Reply,
    Request,
    RequestError,
    TokenOdds,
    completion,
    error_body,
    read_chat,
    read_completion,
)
from specchat.serve.service import Alternatives, Busy, Plan, Service
from specchat.serve.tool_calls import parse_reply, shown_before_calls, tool_names
from specchat.speculative.events import ReplyDone, StepDone, Token

MAX_BODY = 8 * 2**20  # bytes of a request body
RETRY_AFTER_S = 2
DISCONNECT_POLL_S = 0.1
_END = object()


@dataclass(frozen=True)
class Failure:
    """An error raised while the reply ran, carried to the response."""

    error: BaseException


@dataclass(frozen=True)
class Settings:
    model: str  # the name /v1/models lists and every response carries
    config: Config  # the server's settings, which a request's fields override
    api_key: str = ""
    max_body: int = MAX_BODY
    guard: Guard = Guard()  # the Host names and browser origins answered beside loopback ones
    log: AccessLog = to_stderr  # one line a request


class _Left(Exception):
    """The client went away before its request's body arrived."""


def build_app(service: Service, settings: Settings) -> Guarded:
    """The ASGI app to serve: the routes behind guard.py; its `state.service` is the service."""

    async def health(request: HttpRequest) -> Response:
        return _logged(request, settings, _health(service, settings))

    async def models(request: HttpRequest) -> Response:
        refused = _refused(request, settings)
        if refused:
            return _logged(request, settings, refused)
        return _logged(request, settings, JSONResponse({"object": "list", "data": [_model_card(settings.model)]}))

    async def model(request: HttpRequest) -> Response:
        refused = _refused(request, settings)
        if refused:
            return _logged(request, settings, refused)
        name = request.path_params["name"]
        if name != settings.model:
            return _logged(
                request, settings, _error(f"no model {name!r} here: this server runs {settings.model!r}", 404)
            )
        return _logged(request, settings, JSONResponse(_model_card(settings.model)))

    async def chat(request: HttpRequest) -> Response:
        return await _complete(request, service, settings, read_chat, chat=True)

    async def completions(request: HttpRequest) -> Response:
        return await _complete(request, service, settings, read_completion, chat=False)

    async def http_error(request: HttpRequest, error: Exception) -> Response:
        status = getattr(error, "status_code", 500)
        message = {404: f"no route {request.url.path[:200]!r}", 405: f"{request.method} is not allowed on this route"}
        answer = _error(message.get(status, str(getattr(error, "detail", "error"))), status)
        return _logged(request, settings, answer)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.service = service
    return Guarded(app, settings.guard, settings.log)


def _health(service: Service, settings: Settings) -> JSONResponse:
    return JSONResponse(
        {
            "status": "ok",
            "model": settings.model,
            "admitted": service.admitted_now,
            "replies": dict(service.finished),
            "resident_bytes": resident_bytes(),
        }
    )


def _model_card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "specchat"}


def _logged(request: HttpRequest, settings: Settings, response: Response, **figures: Any) -> Response:
    settings.log(access_line(request.method, request.url.path, response.status_code, **figures))
    return response


def _error(message: str, status: int, kind: str = "invalid_request_error", **headers: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status_code=status, headers=headers or None)


def _refused(request: HttpRequest, settings: Settings) -> JSONResponse | None:
    """401 unless the request carries the API key (when the server has one)."""
    if not settings.api_key:
        return None
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), settings.api_key.encode()):
        return None
    return _error("a valid API key is needed: Authorization: Bearer KEY", 401, "authentication_error")


async def _body(request: HttpRequest, limit: int) -> Any:
    """The JSON body, read to at most `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(f"the request body is over {limit} bytes", status=413)
    data = bytearray()
    try:
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise RequestError(f"the request body is over {limit} bytes", status=413)
    except ClientDisconnect:
        raise _Left() from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise RequestError("the request body is not JSON") from None


async def _complete(
    request: HttpRequest, service: Service, settings: Settings, read: Callable[[Any, Config], Request], chat: bool
) -> Response:
    began = time.perf_counter()
    refused = _refused(request, settings)
    if refused:
        return _logged(request, settings, refused)
    try:
        release = service.admit()  # before the body is read or any tokenizer runs: a full queue answers at once
    except Busy:
        busy = _error(
            "the server is busy: every place in its queue is taken",
            429,
            "rate_limit_error",
            **{"Retry-After": str(RETRY_AFTER_S)},
        )
        return _logged(request, settings, busy)
    try:
        asked = read(await _body(request, settings.max_body), settings.config)
        plan = await asyncio.to_thread(service.plan, asked)  # a long prompt's tokenizing must not stall the loop
    except RequestError as err:
        release()
        return _logged(request, settings, _error(str(err), err.status, err.kind))
    except _Left:
        release()
        settings.log(access_line(request.method, request.url.path, 499, note="the client left before its body came"))
        return Response(status_code=400)
    except BaseException:
        release()
        raise
    cancel = threading.Event()
    events = _run(service, plan, cancel, release)
    finished = _Finished(request, settings, began, len(plan.prompt_ids))
    if asked.stream:
        chunks = Chunks(settings.model, chat)
        return StreamingResponse(
            _sse(events, chunks, asked.include.get("usage", True), cancel, finished, asked),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return await _whole(request, events, cancel, finished, settings.model, chat, asked)


@dataclass
class _Finished:
    """Writes a reply's access-log line once it has ended."""

    request: HttpRequest
    settings: Settings
    began: float
    prompt_tokens: int

    def __call__(self, status: int, done: ReplyDone | None) -> None:
        figures: dict[str, Any] = {"seconds": time.perf_counter() - self.began, "prompt_tokens": self.prompt_tokens}
        if done is not None:
            figures.update(stop_reason=done.stop_reason, stats=done.stats)
        self.settings.log(access_line(self.request.method, self.request.url.path, status, **figures))


def _run(service: Service, plan: Plan, cancel: threading.Event, release: Callable[[], None]) -> asyncio.Queue:
    """Start the reply on a worker thread; its events (then a Failure, if one, then _END) arrive on the queue."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def send(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the server stopped (its loop is closed): nobody is listening, end the reply
            cancel.set()

    def produce() -> None:
        try:
            for event in service.events(plan, cancel):
                send(event)
        except BaseException as err:  # carried to the response as one error
            send(Failure(err))
        finally:
            release()
            send(_END)

    threading.Thread(target=produce, name="specchat-reply", daemon=True).start()
    return queue


async def _whole(
    request: HttpRequest,
    events: asyncio.Queue,
    cancel: threading.Event,
    finished: _Finished,
    model: str,
    chat: bool,
    asked: Request,
) -> Response:
    """Wait for the whole reply, cancelling it if the client goes away."""
    origins: list[str] = []
    odds: list[TokenOdds] = []
    done: ReplyDone | None = None
    while True:
        try:
            item = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                cancel.set()
            continue
        if item is _END:
            break
        if isinstance(item, Failure):
            answer = _failure(item.error)
            finished(answer.status_code, None)
            return answer
        _collect_odds(item, odds)
        if isinstance(item, Token):
            origins.append(item.origin.value)
        elif isinstance(item, ReplyDone):
            done = item
    if done is None:
        finished(500, None)
        return _error("the reply ended without its end", 500, "server_error")
    finished(200, done)
    ids, stop_reason = list(done.ids), done.stop_reason
    logprobs = odds[: len(ids)] if asked.logprobs else None
    reply = Reply(
        done.text,
        ids,
        origins[: len(ids)],
        stop_reason,
        finished.prompt_tokens,
        done.stats,
        tool_names(asked.tools),
        logprobs,
    )
    return JSONResponse(completion(reply, model, chat))


def _collect_odds(item: Any, odds: list[TokenOdds]) -> None:
    """Each Token's text and target p into `odds`, and the Alternatives (top_logprobs) that follow it."""
    if isinstance(item, Token):
        odds.append((item.text, item.odds.p, []))
    elif isinstance(item, Alternatives) and odds:
        odds[-1] = (*odds[-1][:2], item.items)


def _failure(error: BaseException) -> JSONResponse:
    if isinstance(error, ValueError):
        return _error(f"the reply failed: {error}", 400)
    return _error(f"the reply failed: {type(error).__name__}: {error}", 500, "server_error")


def _sse_line(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _sse(
    events: asyncio.Queue,
    chunks: Chunks,
    with_usage: bool,
    cancel: threading.Event,
    finished: _Finished,
    asked: Request,
) -> AsyncIterator[str]:
    """The reply as server-sent events: a chunk per step, the last with the finish reason (and usage), [DONE].
    With tools offered, text from a call's markup on is held, and the calls follow as one tool_calls chunk."""
    pending: list[Token] = []
    pending_odds: list[TokenOdds] = []
    done: ReplyDone | None = None
    tools = bool(asked.tools)
    text = sent = ""  # the reply's text so far, and what of it went out as content
    try:
        if chunks.chat:
            yield _sse_line(chunks.first())
        while True:
            item = await events.get()
            if item is _END:
                break
            if isinstance(item, Failure):
                yield _sse_line(error_body(f"the reply failed: {item.error}", "server_error"))
                break
            _collect_odds(item, pending_odds)
            if isinstance(item, Token):
                pending.append(item)
            elif isinstance(item, (StepDone, ReplyDone)) and pending:
                text += "".join(t.text for t in pending)
                shown = shown_before_calls(text) if tools else text
                ids, origins = [t.id for t in pending], [t.origin.value for t in pending]
                odds = pending_odds if asked.logprobs else None
                yield _sse_line(chunks.text(shown[len(sent) :], ids, origins, odds))
                sent, pending, pending_odds = shown, [], []
            if isinstance(item, ReplyDone):
                done = item
                calls = parse_reply(text, tool_names(asked.tools)).calls if tools else []
                if calls:
                    yield _sse_line(chunks.tool_calls(calls))
                elif len(text) > len(sent):  # held text that never became a call
                    yield _sse_line(chunks.text(text[len(sent) :], [], []))
                yield _sse_line(
                    chunks.last(item.stop_reason, finished.prompt_tokens, item.stats, with_usage, bool(calls))
                )
        yield "data: [DONE]\n\n"
    finally:
        cancel.set()  # the client went away (or the reply is done): the engine stops after its step
        finished(200, done)
