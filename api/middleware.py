"""Pure ASGI middleware: the request-body limit, the NUL refusal and the Prometheus request metrics."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_MEDIA_TYPE, InvalidInput, problem_body, problem_body_of
from api.openai.errors import OPENAI_PREFIXES, error_body

if TYPE_CHECKING:
    from api.ops.metrics import ApiMetrics


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


class BodyLimitMiddleware:
    """Refuses bodies over ``max_bytes`` with 413, counting bytes as they arrive.

    A declared Content-Length over the limit is refused before reading; a body that streams past
    the limit (chunked, or a lying Content-Length) fails at the read that crosses it. The error is a
    Starlette HTTPException so FastAPI's body parser re-raises it instead of calling it a 400.
    A compressed body (``Content-Encoding`` other than identity) is refused with 415 before reading:
    nothing here decompresses, so a gzip bomb never expands, and the client learns why at once.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding = _header(scope, b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            await _send_415(scope, send, encoding.decode("latin-1"))
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(scope, send, self.max_bytes)
            return
        received = 0
        limit = self.max_bytes

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise StarletteHTTPException(413, _too_large(limit))
            return message

        await self.app(scope, limited, send)


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def _send_413(scope: Scope, send: Send, limit: int) -> None:
    body = problem_body(status=413, slug="body-too-large", title="Request body too large",
                        detail=_too_large(limit), instance=scope.get("path", ""))
    await _send_problem(send, body, [])


async def _send_415(scope: Scope, send: Send, encoding: str) -> None:
    detail = f"Content-Encoding {encoding[:40]!r} is not accepted: send the body uncompressed"
    body = problem_body(status=415, slug="unsupported-media-type", title="Unsupported media type",
                        detail=detail, instance=scope.get("path", ""),
                        errors=[{"field": "Content-Encoding", "message": "only identity is accepted"}])
    await _send_problem(send, body, [(b"accept-encoding", b"identity")])  # RFC 7694


async def _send_problem(send: Send, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    await _send_json(send, body["status"], body, PROBLEM_MEDIA_TYPE, headers)


async def _send_json(send: Send, status: int, body: dict[str, Any], media_type: str,
                     headers: list[tuple[bytes, bytes]]) -> None:
    """An answer sent before the app read the request's body: the connection is closed after it."""
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", media_type.encode()),
                            (b"content-length", str(len(raw)).encode()), (b"connection", b"close"),
                            *headers]})
    await send({"type": "http.response.body", "body": raw})


class NulRefusalMiddleware:
    """Refuses with 422 a request whose path or query carries a NUL character, on every route.

    No stored text can hold one (Postgres refuses it in text fields), and a query parameter reaches
    the database as a bound value, so the refusal belongs before any route runs. The body is the
    route's own error shape: OpenAI's on the OpenAI-compatible routes, problem+json elsewhere.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            field = _nul_field(scope)
            if field is not None:
                await _send_nul_refusal(scope, send, field)
                return
        await self.app(scope, receive, send)


def _nul_field(scope: Scope) -> str | None:
    """The first place a NUL sits in the request line: ``path`` or the query parameter's name."""
    if "\x00" in scope.get("path", ""):
        return "path"
    raw = bytes(scope.get("query_string", b""))
    if b"\x00" not in raw and b"%00" not in raw:
        return None
    for name, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return name.replace("\x00", "").strip() or "query"
    return None


async def _send_nul_refusal(scope: Scope, send: Send, field: str) -> None:
    error = InvalidInput.for_field(field, "contains a NUL character")
    path = str(scope.get("path", ""))
    if path.startswith(OPENAI_PREFIXES):
        status, body = error_body(error)
        await _send_json(send, status, body, "application/json", [])
        return
    await _send_problem(send, problem_body_of(error, instance=path.replace("\x00", "")), [])


class MetricsMiddleware:
    """Counts requests and their latency by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)
