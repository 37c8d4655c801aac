"""Fuzz the API from its own OpenAPI schema (schemathesis, over ASGI against the real model):
no generated input, valid or not, gets a 500."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode

from ingot.runtime.server import create_app

from server_support import MODEL, STARTUP_TIMEOUT_S, artifact_llm, fuzz_settings

MAX_EXAMPLES = 50


def _without_lifespan(app):
    """The app, but lifespan events leave AsyncLLM alone: schemathesis ends the lifespan
    after every test, while one AsyncLLM serves the whole module."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)
        while True:
            message = await receive()
            kind = message["type"].split(".")[-1]  # startup | shutdown
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return

    return wrapped


@pytest.fixture(scope="module")
def llm(artifact):
    llm = artifact_llm(artifact, max_num_seqs=4, max_queue=64)
    llm.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not llm.ready:
        assert time.monotonic() < deadline and llm.error is None, llm.error
        time.sleep(0.05)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def api_schema(llm):
    app = _without_lifespan(create_app(llm, MODEL))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
CASES = [  # (path, method, generation mode, examples); GETs take no input to get wrong
    ("/v1/completions", "POST", POSITIVE, MAX_EXAMPLES),
    ("/v1/completions", "POST", NEGATIVE, MAX_EXAMPLES),
    ("/v1/chat/completions", "POST", POSITIVE, MAX_EXAMPLES),
    ("/v1/chat/completions", "POST", NEGATIVE, MAX_EXAMPLES),
    ("/v1/models", "GET", POSITIVE, 3),
    ("/health", "GET", POSITIVE, 3),
    ("/metrics", "GET", POSITIVE, 3),
]


@pytest.mark.parametrize(("path", "method", "mode", "examples"), CASES)
def test_no_input_gets_a_500(api_schema, path, method, mode, examples):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @fuzz_settings(examples)
    def check(case):
        response = case.call()
        assert response.status_code < 500, (case.body, response.text)

    check()
