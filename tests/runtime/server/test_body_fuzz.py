"""Arbitrary request bodies through the real HTTP server get a 2xx or a 4xx, never a 5xx, and
the server stays up: any JSON value, any unicode (lone surrogates included, sent as JSON
escapes), raw bytes that are not UTF-8, and valid requests whose text fields hold such strings.

The generator runs over a fake session (tests/runtime/server/server_support.py), so hundreds of
requests take seconds; the schema-driven fuzzing of the real model is test_schema_fuzz.py.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from server_support import MODEL, LiveServer, fake_llm, fuzz_settings

MAX_EXAMPLES = 60
POST_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")

# Every code point, surrogates included: json.dumps writes those as \ud800-style escapes,
# which a JSON parser turns back into lone surrogates inside the server.
ANY_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
# Bodies close to valid ones, so the fuzzing reaches past the first validation error.
FIELDS = {
    "prompt": ANY_TEXT | st.lists(st.integers(-5, 400), max_size=6) | ANY_JSON,
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": ANY_TEXT}
        ),
        max_size=3,
    )
    | ANY_JSON,
    "max_tokens": st.integers(-2, 80) | ANY_JSON,
    "temperature": st.floats(-1, 3) | ANY_JSON,
    "stop": ANY_TEXT | st.lists(ANY_TEXT, max_size=3),
    "n": st.integers(-1, 4),
    "logprobs": st.integers(-1, 30) | st.booleans(),
    "stream": st.booleans(),
    "tokens": st.lists(st.integers(-5, 400), max_size=6) | ANY_JSON,
    "model": st.sampled_from([MODEL, "other"]) | ANY_TEXT,
}
NEAR_VALID = st.fixed_dictionaries(
    {}, optional={name: strategy for name, strategy in FIELDS.items()}
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    llm, _ = fake_llm(tmp_path_factory.mktemp("fuzz"), max_queue=64)
    with LiveServer(llm) as live, httpx.Client(base_url=live.base_url, timeout=30) as client:
        yield client


def _check(client: httpx.Client, route: str, content: bytes) -> None:
    response = client.post(route, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, (route, content[:200], response.text[:500])
    if response.status_code >= 400:
        assert "error" in response.json(), response.text[:500]
    assert client.get("/health").status_code == 200  # still up, still ready


@pytest.mark.parametrize("route", POST_ROUTES)
def test_any_json_body(server, route):
    @given(body=ANY_JSON | NEAR_VALID)
    @fuzz_settings(MAX_EXAMPLES)
    def check(body):
        _check(server, route, json.dumps(body).encode())

    check()


@pytest.mark.parametrize("route", POST_ROUTES)
def test_raw_bytes_that_are_not_utf8(server, route):
    @given(body=st.binary(max_size=64))
    @fuzz_settings(MAX_EXAMPLES)
    def check(body):
        _check(server, route, body)

    check()


@pytest.mark.parametrize("surrogate", ["\ud800", "\udfff", "abc \ud800 def"])
def test_lone_surrogates_are_a_400_on_a_kept_connection(server, surrogate):
    for route, body in [
        ("/v1/completions", {"prompt": surrogate, "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": surrogate}]}),
    ]:
        response = server.post(route, content=json.dumps(body).encode())
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    # The same keep-alive connection still serves a good request.
    ok = server.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
    assert ok.status_code == 200, ok.text
