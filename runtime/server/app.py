"""The FastAPI application: OpenAI routes, vLLM's /tokenize, /detokenize and /version,
/health, /metrics, and OpenAI-shaped errors.

    app = create_app(AsyncLLM(load, Metrics(name)), name)
    uvicorn.run(app)

Every error, FastAPI's own included (validation 422, unknown route 404, wrong method 405),
leaves as OpenAI's error object `{"error": {"message", "type", "param", "code"}}`
(runtime/server/errors.py), on a connection that stays open; invalid input is a 400, as OpenAI
and vLLM send it, and a body over `max_request_bytes` a 413 before it is parsed. Every response
carries `X-Request-Id` (the client's, else a new one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ingot.runtime.server.async_llm import AsyncLLM
from ingot.runtime.server.errors import UnhandledErrors, error_response, install_error_handlers
from ingot.runtime.server.middleware import DEFAULT_MAX_REQUEST_BYTES, RequestBodyLimit, RequestId
from ingot.runtime.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    model_not_found,
)
from ingot.runtime.server.serving import Serving
from ingot.runtime.server.stream import ServedModel
from ingot.runtime.server.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
)

__all__ = ["create_app"]

_ERRORS = {
    code: {"model": ErrorResponse, "description": description}
    for code, description in (
        (400, "Invalid request"),
        (404, "Unknown model"),
        (408, "Request deadline passed"),
        (413, "Request body over the server's limit"),
        (500, "Server failure"),
        (503, "Loading, at capacity or shutting down (see Retry-After)"),
    )
}


def _version() -> str:
    try:
        return version("ingot")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "unknown"


_VERSION = _version()


def create_app(
    llm: AsyncLLM, model_name: str, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> FastAPI:
    """The app serving `llm` as `model_name`; its lifespan starts and stops its thread.
    Request bodies over `max_request_bytes` get a 413 before they are parsed."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        llm.start()
        yield
        await asyncio.to_thread(llm.shutdown)

    app = FastAPI(title="ingot", summary="OpenAI-compatible server", lifespan=lifespan)
    install_error_handlers(app)
    # The last added runs first: every response, a 413 or a 500 included, gets its
    # X-Request-Id.
    app.add_middleware(UnhandledErrors)
    app.add_middleware(RequestBodyLimit, max_bytes=max_request_bytes)
    app.add_middleware(RequestId)
    _add_status_routes(app, llm, model_name)
    _add_model_routes(app, llm, model_name)
    return app


def _add_status_routes(app: FastAPI, llm: AsyncLLM, model_name: str) -> None:
    """/health, /metrics, /v1/models[/ID] and /version: what the server is and holds."""

    def card() -> ModelCard:
        model = llm.model
        return ModelCard(
            id=model_name, max_model_len=model.max_model_len if model is not None else None
        )

    @app.get("/health", responses={503: _ERRORS[503]})
    async def health() -> Response:
        """200 once the artifact is verified and warmed up; 503 while loading, failed or
        shutting down."""
        if llm.error is not None:
            return error_response(
                APIError(503, f"the server failed: {llm.error}", type="server_error")
            )
        if not llm.ready:
            state = "shutting down" if llm.draining else "loading"
            return error_response(APIError(503, f"not ready: {state}", type="service_unavailable"))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format, vLLM's metric names."""
        return Response(llm.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[card()])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERRORS)
    async def retrieve_model(model_id: str) -> ModelCard:
        """OpenAI's models.retrieve."""
        if model_id != model_name:
            raise model_not_found(model_id)
        return card()

    @app.get("/version")
    async def server_version() -> dict[str, str]:
        """ingot's version (vLLM's /version)."""
        return {"version": _VERSION}


def _add_model_routes(app: FastAPI, llm: AsyncLLM, model_name: str) -> None:
    """The routes that use the model: completions, chat, /tokenize and /detokenize."""
    serving = Serving(llm, model_name)

    def served(requested: str | None) -> ServedModel:
        if requested is not None and requested != model_name:
            raise model_not_found(requested)
        llm.check_admitting()  # 503 loading / draining, 500 failed
        return llm.model

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize_route(body: TokenizeRequest) -> TokenizeResponse:
        """vLLM's /tokenize: a prompt or chat messages -> token ids."""
        return await tokenize(served(body.model), body)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize_route(body: DetokenizeRequest) -> DetokenizeResponse:
        """vLLM's /detokenize: token ids -> text."""
        return await detokenize(served(body.model), body)

    @app.post("/v1/completions", responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.completions(body))

    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _until_disconnect(request, serving.chat(body))


async def _until_disconnect(request: Request, handler: Awaitable[Response]) -> Response:
    """Run `handler`, cancelling it if the client disconnects first.

    Starlette cancels nothing on its own until a response streams, so a request waiting in
    the queue or generating a non-streamed answer would run on for nobody. Cancelling the
    handler lands in its `finally`, which aborts the request and frees its blocks.
    """
    task = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    return task.result()


async def _disconnected(request: Request) -> None:
    # The body was read before the handler ran, so the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
