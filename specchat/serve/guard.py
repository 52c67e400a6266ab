"""What keeps a server on a desktop from being used by the web pages its user visits.

- **Host**: a page on another site that rebinds its own name to 127.0.0.1 (DNS rebinding) sends its own name in
  `Host`. Only loopback names, IP literals (a rebinding page cannot send one), the `--host` name and the
  `--allow-host` names are answered; any other is a 403.
- **Origin**: a browser names the page's origin on every cross-origin request, and sends a "simple" POST
  (`Content-Type: text/plain`) with no preflight. A request with an `Origin` is refused (403) unless `--cors`
  allows that origin; an allowed one gets the CORS headers, its preflight (`OPTIONS`) a 204.
- **Content type**: a POST must say `application/json` (415 otherwise), which no simple cross-origin request can.

Clients that are programs (the openai package, curl, editors) send a loopback Host, no Origin and JSON.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from specchat.serve.access_log import access_line
from specchat.serve.protocol import error_body

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
ALLOWED_HEADERS = "Authorization, Content-Type"
PREFLIGHT_MAX_AGE_S = "600"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Guard:
    """The names a request's Host may carry and the origins a browser may send requests from."""

    hosts: frozenset[str] = frozenset()  # beside loopback names and IP literals ("*": any)
    origins: frozenset[str] = frozenset()  # "*": any

    @classmethod
    def of(cls, listen_host: str, allow_hosts: list[str], cors: list[str]) -> Guard:
        hosts = {name.lower().rstrip(".") for name in [listen_host, *allow_hosts] if name}
        return cls(frozenset(hosts), frozenset(origin.rstrip("/") for origin in cors))

    def host_allowed(self, host_header: str) -> bool:
        name = host_name(host_header)
        if not name:
            return False
        return "*" in self.hosts or name in LOOPBACK_NAMES or name in self.hosts or is_ip_literal(name)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/") in self.origins


def host_name(host_header: str) -> str:
    """The name of a Host header, without its port and brackets, in lower case ('' when malformed)."""
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        end = host.find("]")
        return host[1:end] if end > 0 else ""
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guarded:
    """`app` behind the Host, Origin and content-type checks (an ASGI middleware); `state` is the app's."""

    def __init__(self, app: Any, guard: Guard, log: Callable[[str], None] | None = None):
        self.app, self.guard, self.log = app, guard, log
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        refusal = _refusal(scope["method"], headers, self.guard)
        if refusal is not None:
            if self.log is not None:
                self.log(access_line(scope["method"], scope.get("path", ""), refusal[0]))
            await _respond(send, *refusal)
            return
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
        elif scope["method"] == "OPTIONS":
            await _respond(send, 204, None, _cors_headers(origin, preflight=True))
        else:
            await self.app(scope, receive, _with_cors(send, origin))


def _refusal(method: str, headers: dict[str, str], guard: Guard) -> tuple[int, dict | None, list] | None:
    """(status, error body, headers) of a request refused here, or None."""
    host = headers.get("host", "")
    if not guard.host_allowed(host):
        return (
            403,
            error_body(f"the Host {host[:100]!r} is not this server's (start it with --allow-host NAME to add one)"),
            [],
        )
    origin = headers.get("origin")
    if origin is not None and not guard.origin_allowed(origin):
        return (
            403,
            error_body(f"requests from the web page origin {origin[:100]!r} are refused (--cors ORIGIN allows one)"),
            [],
        )
    if method == "POST":
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            return 415, error_body("the body must be JSON, sent with Content-Type: application/json"), []
    return None


def _cors_headers(origin: str, preflight: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
    if preflight:
        headers += [
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE_S.encode()),
        ]
    return headers


def _with_cors(send: Send, origin: str) -> Send:
    async def sending(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *_cors_headers(origin)]}
        await send(message)

    return sending


async def _respond(send: Send, status: int, body: dict | None, headers: list) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    kinds = [(b"content-type", b"application/json")] if body is not None else []
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*kinds, (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})
