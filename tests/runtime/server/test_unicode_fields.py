"""Arbitrary unicode, lone surrogates included, in every string field of every route gets a 2xx
or a 4xx carrying OpenAI's error object, and the keep-alive connection then answers a second
request (issue 31's "how to tell").

Bodies go over a raw socket as JSON bytes, where a lone surrogate can only travel as a
"\\ud800" escape (json.dumps writes it so); the server's JSON parser turns it back into one.
A fake session runs the model (tests/runtime/server/server_support.py), so a few hundred
requests take seconds.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raw_http import RawConnection, RawResponse
from server_support import MODEL, LiveServer, fake_llm, fuzz_settings

MAX_EXAMPLES = 100

# Any code point, with lone surrogates (which st.characters rarely draws) and JSON's and
# regex's own syntax made likely; two adjacent surrogates may pair into one character.
CHARACTERS = (
    st.characters(min_codepoint=0, max_codepoint=0x10FFFF)
    | st.integers(0xD800, 0xDFFF).map(chr)
    | st.sampled_from('"\\{}[]()|*+?.:^$ \n')
)
TEXT = st.text(CHARACTERS, max_size=12)
SOME_TEXT = st.text(CHARACTERS, min_size=1, max_size=12)
MODEL_NAME = st.just(MODEL) | TEXT
ROLE = st.sampled_from(["user", "system", "assistant"]) | TEXT
CONTENT = TEXT | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2
)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT}, optional={"name": TEXT}),
    min_size=1,
    max_size=2,
)
SCHEMA = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(TEXT, st.just({"type": "string"}))},
    optional={"required": st.lists(TEXT, max_size=2), "title": TEXT},
) | st.fixed_dictionaries({"enum": st.lists(TEXT, min_size=1, max_size=2)})
# At most one output constraint per request, so the request gets past "one at a time".
CONSTRAINT = st.one_of(
    st.just({}),
    st.builds(lambda r: {"structured_outputs": {"regex": r}}, TEXT),
    st.builds(lambda c: {"structured_outputs": {"choice": c}}, st.lists(TEXT, max_size=3)),
    st.builds(lambda g: {"structured_outputs": {"grammar": g}}, TEXT),
    st.builds(lambda j: {"structured_outputs": {"json": j}}, TEXT | SCHEMA),
    st.builds(lambda r: {"guided_regex": r}, TEXT),
    st.builds(lambda c: {"guided_choice": c}, st.lists(TEXT, max_size=3)),
    st.builds(lambda g: {"guided_grammar": g}, TEXT),
    st.builds(lambda j: {"guided_json": j}, TEXT | SCHEMA),
    st.builds(
        lambda name, schema: {
            "response_format": {"type": "json_schema", "json_schema": {"name": name, **schema}}
        },
        TEXT,
        st.just({}) | SCHEMA.map(lambda s: {"schema": s}),
    ),
)
STOP = TEXT | st.lists(TEXT, max_size=3)
SAMPLING = {"model": MODEL_NAME, "stop": STOP, "user": TEXT, "stream": st.booleans()}
COMPLETION = st.fixed_dictionaries(
    {"prompt": TEXT | st.lists(SOME_TEXT, min_size=1, max_size=2), "max_tokens": st.just(2)},
    optional={**SAMPLING, "suffix": TEXT, "logit_bias": st.dictionaries(TEXT, st.just(1.0))},
)
TOOLS = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": TEXT})}
    ),
    max_size=1,
)
CHAT = st.fixed_dictionaries(
    {"messages": MESSAGES, "max_tokens": st.just(2)}, optional={**SAMPLING, "tools": TOOLS}
)


def _with_constraint(body: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    return st.builds(lambda b, c: {**b, **c}, body, CONSTRAINT)


ROUTES = {
    "/v1/completions": _with_constraint(COMPLETION),
    "/v1/chat/completions": _with_constraint(CHAT),
    "/tokenize": st.fixed_dictionaries({"prompt": TEXT}, optional={"model": MODEL_NAME})
    | st.fixed_dictionaries({"messages": MESSAGES}, optional={"model": MODEL_NAME}),
    "/detokenize": st.fixed_dictionaries(
        {"tokens": st.lists(st.integers(0, 300), max_size=4)}, optional={"model": MODEL_NAME}
    ),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llm, _ = fake_llm(tmp_path_factory.mktemp("unicode"), max_queue=64)
    with LiveServer(llm) as live:
        yield live


def _answered(response: RawResponse) -> None:
    """A 2xx, or a 4xx whose body is OpenAI's error object."""
    assert 200 <= response.status < 300 or 400 <= response.status < 500, response.body[:500]
    if response.status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"], error


def _still_open(connection: RawConnection) -> None:
    """The same socket answers a second request (raises ConnectionError if it was closed)."""
    second = connection.request("GET", f"/v1/models/{MODEL}")
    assert second.status == 200 and second.json()["id"] == MODEL, second.body


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_any_unicode_in_any_string_field(served, route):
    @given(body=ROUTES[route])
    @fuzz_settings(MAX_EXAMPLES)
    def check(body):
        with RawConnection(served.port) as connection:
            _answered(connection.post_json(route, body))
            _still_open(connection)

    check()


def test_any_unicode_in_the_model_id_of_the_path(served):
    @given(name=TEXT)
    @fuzz_settings(MAX_EXAMPLES)
    def check(name):
        path = "/v1/models/" + quote(name, safe="", errors="surrogatepass")
        with RawConnection(served.port) as connection:
            _answered(connection.request("GET", path))
            _still_open(connection)

    check()
