"""The server and the Python API accept the same sampling values (issue 31 item 5): the server
builds SamplingParams from each request, so whatever SamplingParams refuses is a 400 naming the
field, and whatever it takes the server serves; the request's types are strict as vLLM's
(a bool is not a number, a string is not a number, a prompt list holds integers or strings)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingot.runtime.sampling import SamplingParams

from server_support import LiveServer, fake_llm, fuzz_settings

MAX_EXAMPLES = 150
PROMPT = {"prompt": "abc", "max_tokens": 4}

# JSON values of the wrong type for every field, and edges of the right ones.
WRONG_TYPES = [True, False, "1", "", [], {}, [1], ["a"], {"1": 1}]
NUMBERS = [0, 1, -1, -2, 2, 3, 0.5, 1.0, 2.5, -0.5, 1e-6, 1e9, 2**31 - 1, 2**31, 2**63]
# JSON "NaN" / "Infinity" (Python's json reads them): non-finite numbers reach SamplingParams.
NON_FINITE = [float("nan"), float("inf"), float("-inf")]
# Values the fake server could run (within its context and queue), per field.
FIELDS = {
    "temperature": NUMBERS + NON_FINITE,
    "top_p": NUMBERS + NON_FINITE,
    "top_k": NUMBERS,
    "seed": NUMBERS,
    "max_tokens": [0, 1, 4, -1, 1.0, 2**31],
    "min_tokens": [0, 1, 4, 5, -1, 1.0],
    "n": [0, 1, 2, -1, 1.0],
    "best_of": [0, 1, 2, 3, -1, 1.0],
    "presence_penalty": NUMBERS + NON_FINITE,
    "frequency_penalty": NUMBERS + NON_FINITE,
    "repetition_penalty": NUMBERS + NON_FINITE,
    "logprobs": [0, 1, 5, 20, 21, -1, 1.0],
    "stop": ["a", "z", ["a", "b"], [""], [1], 1],
    "stop_token_ids": [[5], [-1], [2**31], [1.0], [True], 5],
    "ignore_eos": [0, 1, "true"],
    "include_stop_str_in_output": [0, 1, "true"],
    "logit_bias": [{"5": 1}, {"5": 500}, {"x": 1}, {"-1": 1}, {"5": True}, {"5": "1"}, [1]],
}
VALUES = {name: st.sampled_from(values + WRONG_TYPES) for name, values in FIELDS.items()}
# One to three fields at a time: interactions (n and best_of, max_tokens and min_tokens) too.
SOME_FIELDS = st.lists(
    st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3, unique=True
).flatmap(lambda names: st.fixed_dictionaries({name: VALUES[name] for name in names}))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    llm, _ = fake_llm(tmp_path_factory.mktemp("values"), max_queue=16)
    with LiveServer(llm) as live, httpx.Client(base_url=live.base_url, timeout=30) as client:
        yield client


def _python_accepts(fields: dict) -> bool:
    """What LLM.generate would do with the same values (the request's defaults otherwise)."""
    kwargs = {"max_tokens": 4, **fields}
    if isinstance(kwargs.get("stop"), str):
        kwargs["stop"] = [kwargs["stop"]]
    try:
        SamplingParams(**kwargs)
    except ValueError:
        return False
    return True


def _post(client: httpx.Client, body: dict) -> httpx.Response:
    content = json.dumps(body).encode()  # NaN and Infinity as Python's json writes them
    return client.post(
        "/v1/completions", content=content, headers={"content-type": "application/json"}
    )


@given(fields=SOME_FIELDS)
@fuzz_settings(MAX_EXAMPLES)
def test_the_server_accepts_what_sampling_params_accepts(client, fields):
    response = _post(client, {**PROMPT, **fields})
    python = _python_accepts(fields)
    assert response.status_code in (200, 400), response.text
    assert (response.status_code == 200) == python, (fields, response.text)
    if response.status_code == 400:
        param = response.json()["error"]["param"]
        assert param is not None and param.split(".")[0] in fields, (fields, response.text)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", True),
        ("temperature", "1"),
        ("top_p", "0.5"),
        ("max_tokens", "4"),
        ("max_tokens", 4.0),
        ("n", True),
        ("seed", "7"),
        ("stream", "true"),
        ("stream", 1),
        ("echo", 0),
        ("prompt", [True]),
        ("prompt", [1.0, 2.0]),
        ("prompt", [["a"]]),
        ("prompt", [1, "a"]),
        ("prompt", 5),
        ("logit_bias", {"5": "1"}),
        ("stream_options", {"include_usage": "yes"}),
    ],
)
def test_types_are_strict(client, field, value):
    body = {**PROMPT, field: value}
    if field == "stream_options":
        body["stream"] = True
    response = _post(client, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == field, error


def test_a_prompt_of_no_shape_gets_one_message(client):
    error = _post(client, {**PROMPT, "prompt": [True]}).json()["error"]
    assert error["param"] == "prompt" and error["message"].startswith(
        "prompt: Input should be a string, a list of token ids"
    ), error


def test_top_k_minus_one_and_zero_are_no_limit_on_both(client):
    sampled = {**PROMPT, "temperature": 1.0, "seed": 3, "max_tokens": 8}
    texts = [_post(client, {**sampled, "top_k": k}).json()["choices"][0]["text"] for k in (-1, 0)]
    assert texts[0] == texts[1]
    assert SamplingParams(top_k=-1).top_k == 0 == SamplingParams(top_k=0).top_k


def test_chat_names_its_own_fields(client):
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    for body, param in [
        ({**chat, "top_logprobs": 21}, "top_logprobs"),
        ({**chat, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({**chat, "max_tokens": 0}, "max_tokens"),
        ({**chat, "temperature": -1}, "temperature"),
    ]:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["message"].startswith(f"{param} must"), error
