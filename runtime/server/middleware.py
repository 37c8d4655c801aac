"""Pure ASGI middleware: a request body size limit enforced before anything parses the body,
a 400 for a body framed two ways, and `X-Request-Id` on every response.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so the limit sees the body as it arrives: a
declared Content-Length over the limit is refused before one byte is read, and a chunked body
is counted chunk by chunk and refused as soon as it passes the limit, never buffered whole.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ingot.runtime.memory import format_bytes
from ingot.runtime.server.heap import give_back_freed_memory
from ingot.runtime.server.protocol import APIError

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "MAX_REQUEST_ID_CHARS",
    "RequestBodyLimit",
    "RequestId",
    "request_id_of",
]

# Far above any real prompt (a 128k-token context is well under 1 MiB of text), far below
# what would hurt the server to buffer.
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
# After a body this large, freed memory goes back to the system (give_back_freed_memory).
TRIM_AFTER_BYTES = 1 << 20

_REQUEST_ID = b"x-request-id"
# A client's X-Request-Id longer than this, or with characters outside printable ASCII, is
# replaced by a new id: echoed, logged and kept per request, it must stay small. Replaced,
# not truncated: a cut id is a different id that may be another request's, and one that
# does not match what the client sent shows the client its id was not used.
MAX_REQUEST_ID_CHARS = 128

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestBodyLimit:
    """Answers 413 (OpenAI's error object) to a request whose body exceeds `max_bytes`, and
    400 to one that declares both Content-Length and Transfer-Encoding.

    The body is read here, counted as it arrives, and handed on whole to the app (which would
    read it whole anyway); what follows it (the disconnect) comes from the server as before.
    A body framed both ways is how request smuggling starts (RFC 9112 6.1: a server may
    refuse it, and must close the connection after it): h11 would read it chunked, a proxy in
    front might have read Content-Length; refused, neither reading matters.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and _header(scope, b"transfer-encoding") is not None:
            error = APIError(
                400,
                "the request has both Content-Length and Transfer-Encoding; send one",
                code="ambiguous_request_framing",
            )
            await _refuse(send, error)
            return
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        body, size = await self._read_body(receive, send)
        if body is not None:  # else answered (413), or the client left before sending it all
            await self.app(scope, _replay(body, receive), send)
            del body
        if size >= TRIM_AFTER_BYTES:  # milliseconds: off the event loop
            await asyncio.to_thread(give_back_freed_memory)

    async def _read_body(self, receive: Receive, send: Send) -> tuple[bytes | None, int]:
        """The whole body and its size; None for the body once a 413 is sent or the client
        left, with the bytes read until then."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return None, size
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return None, size
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), size

    async def _too_large(self, send: Send) -> None:
        error = APIError(
            413,
            f"the request body is larger than this server's limit of "
            f"{format_bytes(self.max_bytes)}",
            code="request_too_large",
        )
        await _refuse(send, error)


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app: the body read, whole, then what the server sends next."""
    first: Message | None = {"type": "http.request", "body": body}

    async def replay() -> Message:
        nonlocal first
        if first is not None:
            message, first = first, None
            return message
        return await receive()

    return replay


async def _refuse(send: Send, error: APIError) -> None:
    """Answer `error` before the body is read, and close the connection (the rest of the body
    is never read, so nothing after it on the connection could be parsed)."""
    payload = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class RequestId:
    """Echoes the client's `X-Request-Id` on the response, or sets a new one (vLLM's
    --enable-request-id-headers, always on); one over MAX_REQUEST_ID_CHARS or not printable
    ASCII is replaced by a new one. The id is in `scope["state"]["request_id"]` for handlers
    that answer outside this middleware (the 500 handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = _header(scope, _REQUEST_ID)
        request_id = raw.encode("latin-1") if _usable_id(raw) else uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != _REQUEST_ID]
                message = {**message, "headers": [*headers, (_REQUEST_ID, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_of(scope: Scope) -> str | None:
    """The id RequestId gave this request, if it ran."""
    return scope.get("state", {}).get("request_id")


def _usable_id(raw: str | None) -> bool:
    return bool(raw) and len(raw) <= MAX_REQUEST_ID_CHARS and raw.isascii() and raw.isprintable()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
