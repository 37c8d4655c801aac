"""Errors through the real HTTP server, on one raw keep-alive connection: whatever the client
sent, the error body is encodable, names the field that was sent, says what is wrong in
words, and the connection serves the next request (issue 31 items 1 and 8)."""

from __future__ import annotations

import pytest

from raw_http import RawConnection
from server_support import MODEL, LiveServer, fake_llm

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "abc", "max_tokens": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llm, _ = fake_llm(tmp_path_factory.mktemp("errors"), max_queue=16)
    with LiveServer(llm) as live:
        yield live


@pytest.fixture
def connection(served):
    with RawConnection(served.port) as connection:
        yield connection


def _error(response, status: int) -> dict:
    assert response.status == status, response.body
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def _still_serving(connection: RawConnection) -> None:
    response = connection.post_json("/v1/completions", COMPLETION)
    assert response.status == 200, response.body
    assert response.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", COMPLETION),
        ("/v1/completions", {**COMPLETION, "stream": True}),
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/tokenize", {"prompt": "abc"}),
        ("/detokenize", {"tokens": [3]}),
    ],
)
def test_a_lone_surrogate_model_is_a_404_that_keeps_the_connection(connection, route, body):
    error = _error(connection.post_json(route, {**body, "model": "gpt\ud800x"}), 404)
    # The name is echoed with the surrogate written as its escape's text.
    assert error["message"] == "The model `gpt\\ud800x` does not exist.", error
    assert error["param"] == "model" and error["code"] == "model_not_found"
    _still_serving(connection)


def test_a_lone_surrogate_stop_string_is_a_400(connection):
    for stop in ["\udfff", ["ok", "a\ud800"]]:
        error = _error(connection.post_json("/v1/completions", {**COMPLETION, "stop": stop}), 400)
        assert error["param"] == "stop" and "lone surrogate" in error["message"], error
    _still_serving(connection)


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        ({"structured_outputs": {"regex": "a\ud800"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["yes", "\ud800"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'start: "\ud800"'}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json": {"enum": ["\ud800"]}}}, "structured_outputs.json"),
        ({"guided_regex": "\ud800"}, "guided_regex"),
        ({"guided_choice": ["\udc00"]}, "guided_choice"),
        ({"guided_grammar": "\ud800"}, "guided_grammar"),
        ({"guided_json": '{"enum": ["\\ud800"]}'}, "guided_json"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"x": "\ud800"}},
                }
            },
            "response_format",
        ),
    ],
)
def test_a_lone_surrogate_constraint_names_its_field_in_words(connection, constraint, param):
    for route, body in [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]:
        error = _error(connection.post_json(route, {**body, **constraint}), 400)
        assert error["param"] == param, error
        assert error["message"].startswith(f"{param}: ") and "lone surrogate" in error["message"]
        assert "codec" not in error["message"], error
    _still_serving(connection)


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 1}}}},
            "response_format",
        ),
    ],
)
def test_an_invalid_constraint_names_the_field_that_was_sent(connection, constraint, param):
    error = _error(connection.post_json("/v1/completions", {**COMPLETION, **constraint}), 400)
    assert error["param"] == param and error["message"].startswith(param), error


def test_an_unexpected_error_is_a_500_that_keeps_the_connection(served, connection, monkeypatch):
    def broken() -> None:
        raise RuntimeError("broken \ud800 on purpose")

    with monkeypatch.context() as patch:
        patch.setattr(served.llm, "check_admitting", broken)
        response = connection.post_json("/v1/completions", COMPLETION)
        error = _error(response, 500)
        assert error["message"] == "RuntimeError: broken \\ud800 on purpose", error
        assert error["type"] == "server_error" and response.headers["x-request-id"]
    _still_serving(connection)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"prompt": "abc", "max_tokens": 4,}',
            "Expecting property name enclosed in double quotes: line 1 column 35 (char 34)",
        ),
        (
            b'{"prompt": "abc"\n "max_tokens": 4}',
            "Expecting ',' delimiter: line 2 column 2 (char 18)",
        ),
        (b'{"prompt": "ab', "Unterminated string starting at: line 1 column 12 (char 11)"),
        (b"{nope", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ],
)
def test_malformed_json_says_where_and_what(connection, body, expected):
    error = _error(connection.request("POST", "/v1/completions", body), 400)
    assert error["message"] == f"the request body is not valid JSON: {expected}", error
    assert error["param"] is None and error["type"] == "invalid_request_error"
    _still_serving(connection)


def test_a_body_that_is_not_utf8_keeps_the_connection(connection):
    error = _error(connection.request("POST", "/v1/completions", b'{"prompt": "\xff"}'), 400)
    assert "not valid UTF-8" in error["message"], error
    _still_serving(connection)


def test_models_route_with_an_undecodable_id(connection):
    _error(connection.request("GET", "/v1/models/%ED%A0%80"), 404)
    assert connection.request("GET", f"/v1/models/{MODEL}").status == 200
