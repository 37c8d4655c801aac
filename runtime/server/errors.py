"""Every error the server answers, as OpenAI's error object `{"error": {"message", "type",
"param", "code"}}`: APIError, FastAPI's own (validation, unknown route, wrong method, a body
that is not JSON or not UTF-8) and anything unexpected (a 500).

An error never costs the client its keep-alive connection: the body is always encodable
(protocol.ErrorInfo escapes what has no UTF-8 form), and an unexpected exception is answered
here, inside the app, rather than by Starlette's outermost handler, which re-raises it after
answering, so the server closes the connection.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingot.runtime.server.middleware import request_id_of
from ingot.runtime.server.protocol import APIError

__all__ = ["UnhandledErrors", "error_response", "install_error_handlers"]

log = logging.getLogger(__name__)


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def install_error_handlers(app: FastAPI) -> None:
    """APIError, FastAPI's validation and HTTP errors, and (outside every middleware, for an
    error in one of them) anything else, as OpenAI error objects."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(_invalid_request(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        message = str(e.detail)
        if isinstance(e.__cause__, UnicodeDecodeError):  # FastAPI's "error parsing the body"
            cause = e.__cause__
            message = f"the request body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
        headers = getattr(e, "headers", None)
        return error_response(APIError(e.status_code, message, type=kind, headers=headers))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        # Starlette answers this one outside the middleware, so the id is set here.
        request_id = request_id_of(request.scope)
        headers = {"X-Request-Id": request_id} if request_id else None
        return error_response(_server_error(request.url.path, e, headers))


def _invalid_request(e: RequestValidationError) -> APIError:
    """A 400 naming the first field that failed (FastAPI would send a 422), or, for a body
    that is not JSON, where the parser stopped and what it expected."""
    if isinstance(e.__cause__, json.JSONDecodeError):
        # "Expecting ',' delimiter: line 1 column 35 (char 34)", as Python's json says it
        return APIError(400, f"the request body is not valid JSON: {e.__cause__}")
    problems, param = [], None
    for err in e.errors():
        loc = [str(part) for part in err.get("loc", ()) if part != "body"]
        where = ".".join(loc)
        param = param or where or None
        problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return APIError(400, "; ".join(problems) or "invalid request", param=param)


def _server_error(path: str, e: Exception, headers: dict[str, str] | None = None) -> APIError:
    log.error("unhandled error serving %s", path, exc_info=e)
    return APIError(500, f"{type(e).__name__}: {e}", type="server_error", headers=headers)


class UnhandledErrors:
    """Answers an exception the app's handlers did not (a bug: a 500) while the response has
    not started, and keeps the connection: Starlette's own handler would answer too, then
    re-raise, and the server would close the connection under the client's next request.
    An exception after the response started still reaches the server (the response is cut
    short, so the connection cannot be reused)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:
            if started:
                raise
            response = error_response(_server_error(scope.get("path", "?"), e))
            await response(scope, receive, send)
