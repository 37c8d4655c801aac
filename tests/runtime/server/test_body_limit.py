"""Request bodies over the server's limit get a 413 (OpenAI's error object) before anything
parses them: a declared Content-Length at once, a chunked body as soon as it passes the limit."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import uvicorn

from ingot.runtime.server import create_app
from ingot.runtime.server.middleware import DEFAULT_MAX_REQUEST_BYTES, RequestBodyLimit

from server_support import MODEL, LiveServer, fake_llm

LIMIT = 1024


class LimitedServer(LiveServer):
    """LiveServer with a request size limit of `max_request_bytes`."""

    def __init__(self, llm, max_request_bytes: int) -> None:
        super().__init__(llm)
        app = create_app(llm, MODEL, max_request_bytes=max_request_bytes)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)


@pytest.fixture
def server(tmp_path):
    # /tokenize's own limit (max_model_len tokens by default) raised past the body limit's.
    llm, _ = fake_llm(tmp_path, max_tokenize_tokens=LIMIT)
    with LimitedServer(llm, LIMIT) as server:
        yield server


JSON = {"content-type": "application/json"}


def tokenize(server, content) -> httpx.Response:
    return httpx.post(f"{server.base_url}/tokenize", content=content, headers=JSON, timeout=30)


def body_of(size: int) -> bytes:
    """A /tokenize body of exactly `size` bytes."""
    prefix, suffix = b'{"prompt": "', b'"}'
    return prefix + b"a" * (size - len(prefix) - len(suffix)) + suffix


def assert_413(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == "request_too_large"
    assert error["message"] == "the request body is larger than this server's limit of 1 KiB"
    assert r.headers["x-request-id"]


def test_a_body_at_the_limit_is_served(server):
    r = tokenize(server, body_of(LIMIT))
    assert r.status_code == 200, r.text


def test_content_length_over_the_limit(server):
    assert_413(tokenize(server, body_of(LIMIT + 1)))


def test_chunked_body_over_the_limit(server):
    body = body_of(4 * LIMIT)

    def chunks():
        for i in range(0, len(body), 256):
            yield body[i : i + 256]

    r = tokenize(server, chunks())
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert_413(r)


def test_chunked_body_under_the_limit_is_served(server):
    body = body_of(LIMIT)
    r = tokenize(server, iter([body[:500], body[500:]]))
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 200 and r.json()["count"] > 0, r.text


def test_the_default_limit_leaves_room_for_real_prompts():
    assert DEFAULT_MAX_REQUEST_BYTES == 16 << 20


def test_an_oversized_chunked_body_is_not_read_to_the_end():
    received, sent = [], []

    async def receive():
        received.append(1)
        return {"type": "http.request", "body": b"x" * 512, "more_body": True}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("the app must not see an oversized body")

    limit = RequestBodyLimit(app, max_bytes=LIMIT)
    asyncio.run(limit({"type": "http", "headers": []}, receive, send))
    assert len(received) == 3  # 1536 bytes read: over the limit, stop
    assert sent[0]["status"] == 413
