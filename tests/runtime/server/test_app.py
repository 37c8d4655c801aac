"""Routes and errors: OpenAI's error object for every failure, 400 (never 422) for bad input,
404 for an unknown model or route, vLLM's context-length wording, chat template handling."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ingot.runtime.server import create_app

from server_support import MAX_LEN, fake_llm


@pytest.fixture
def call(tmp_path):
    """call(method, path, **httpx kwargs) -> response, against AsyncLLM over a fake session."""
    llms = []

    def make(chat_template="default"):
        kw = {} if chat_template == "default" else {"chat_template": chat_template}
        llm, _ = fake_llm(tmp_path, **kw)
        llms.append(llm)
        llm.start()
        app = create_app(llm, "fake")

        def call(method: str, path: str, **kwargs) -> httpx.Response:
            async def go():
                while not llm.ready:
                    await asyncio.sleep(0.01)
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                    return await c.request(method, path, **kwargs)

            return asyncio.run(asyncio.wait_for(go(), 10))

        return call

    yield make
    for llm in llms:
        llm.shutdown()


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_context_length_is_a_400_in_vllms_words(call):
    post = call()
    response = post("POST", "/v1/completions", json={"prompt": [65] * 10, "max_tokens": 60})
    error = _error(response, 400)
    assert error["message"].startswith(f"This model's maximum context length is {MAX_LEN} tokens")
    assert "10 in the messages, 60 in the completion" in error["message"]
    too_long = post("POST", "/v1/completions", json={"prompt": [65] * MAX_LEN})
    assert _error(too_long, 400)["message"]


def test_unknown_model_is_404(call):
    error = _error(call()("POST", "/v1/completions", json={"model": "gpt-9", "prompt": "a"}), 404)
    assert error["message"] == "The model `gpt-9` does not exist." and error["param"] == "model"
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "a", "n": 3, "best_of": 2}, "best_of"),
        ({"prompt": "a", "best_of": 3, "stream": True}, "best_of"),
        ({"prompt": "a", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "a", "logit_bias": {"999999": 1}}, "logit_bias"),
        ({"prompt": "a", "min_tokens": 20, "max_tokens": 5}, "min_tokens"),
        ({"prompt": "a", "response_format": {"type": "xml"}}, "response_format"),
        ({"prompt": "a", "response_format": {"type": "json_schema"}}, "response_format"),
        ({"prompt": "a", "guided_regex": "(", "max_tokens": 2}, "guided_regex"),
        ({"prompt": "a", "guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "a", "max_tokens": "many"}, "max_tokens"),  # FastAPI would say 422
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": "a", "stop": [""]}, "stop"),
        ({}, "prompt"),
    ],
)
def test_invalid_or_unsupported_input_is_400(call, body, param):
    error = _error(call()("POST", "/v1/completions", json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param), error


def test_malformed_json_and_unknown_routes_use_the_error_object(call):
    c = call()
    bad_json = c(
        "POST", "/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert _error(bad_json, 400)["message"]
    _error(c("GET", "/v1/nothing"), 404)
    _error(c("GET", "/v1/completions"), 405)


def test_chat_uses_the_artifacts_template(call):
    c = call()
    body = {"messages": [{"role": "user", "content": "`"}], "max_tokens": 3, "temperature": 0}
    response = c("POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["message"]["role"] == "assistant"
    # "<|user|>`</s><|assistant|>" and three more tokens: the template was applied, no BOS added.
    assert result["usage"]["prompt_tokens"] > 3 and result["usage"]["completion_tokens"] == 3


def test_chat_without_a_template_is_a_clear_400(call):
    c = call(chat_template=None)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    error = _error(c("POST", "/v1/chat/completions", json=body), 400)
    assert "no chat template" in error["message"] and error["param"] == "messages"


def test_logprobs_in_completions(call):
    body = {"prompt": [65], "max_tokens": 3, "temperature": 0, "logprobs": 2}
    logprobs = call()("POST", "/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["a", "b", "c"]
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    assert [len(top) for top in logprobs["top_logprobs"]] == [2, 2, 2]
    assert logprobs["text_offset"] == [0, 1, 2]


def test_openapi_schema_lists_the_routes(call):
    paths = call()("GET", "/openapi.json").json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(
        paths
    )


def test_logprobs_in_chat(call):
    body = {
        "messages": [{"role": "user", "content": "`"}],
        "max_tokens": 2,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    content = call()("POST", "/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]
    entries = content["content"]
    assert len(entries) == 2
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in entries)
    assert entries[0]["bytes"] == list(entries[0]["token"].encode())


def test_more_samples_than_the_server_holds_is_a_400_not_a_503(call):
    error = _error(
        call()("POST", "/v1/completions", json={"prompt": ["a", "b"], "best_of": 40}), 400
    )
    assert error["param"] == "best_of" and "at most" in error["message"]
