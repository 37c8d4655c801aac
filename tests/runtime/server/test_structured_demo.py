"""JSON-schema output from the demo model parses and validates, greedy and sampled, through
the server and through `LLM`: whitespace between JSON tokens is bounded by default
(runtime/structured.py JSON_WHITESPACE). Under vLLM's default (any whitespace) the same greedy
request pads the object with line breaks until max_tokens."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from ingot import LLM, SamplingParams
from ingot.runtime.structured import StructuredOutput

from server_support import MODEL, LiveServer, artifact_llm

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "version": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "version"],
    "additionalProperties": False,
}
QUESTION = "Describe the os module as JSON."
MAX_TOKENS = 300
CASES = [(0.0, 0)] + [(1.0, seed) for seed in range(10)]  # (temperature, seed)


@pytest.fixture(scope="module")
def demo_llm(demo_artifact):
    return LLM(demo_artifact, kv_cache_memory=16 << 20, max_num_seqs=4)


def _valid(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_output_validates_through_the_server(demo_artifact):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": SCHEMA}},
    }
    with LiveServer(artifact_llm(demo_artifact)) as server:
        for temperature, seed in CASES:
            request = {**body, "temperature": temperature, "seed": seed}
            r = httpx.post(f"{server.base_url}/v1/chat/completions", json=request, timeout=60)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop", (temperature, seed, choice)
            _valid(choice["message"]["content"])


def test_json_schema_output_validates_through_llm(demo_llm):
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=temperature,
            seed=seed,
            structured=StructuredOutput("json_schema", SCHEMA),
        )
        for temperature, seed in CASES
    ]
    outputs = demo_llm.chat([[{"role": "user", "content": QUESTION}]] * len(CASES), params)
    for (temperature, seed), out in zip(CASES, outputs, strict=True):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (temperature, seed, completion.text)
        _valid(completion.text)


def test_unbounded_whitespace_never_closes_the_object(demo_llm):
    # What the default prevents: llguidance's flexible whitespace (vLLM's default), asked for
    # through the schema's own options, on the greedy request above.
    schema = {**SCHEMA, "x-guidance": {"whitespace_flexible": True}}
    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0, structured=StructuredOutput("json_schema", schema)
    )
    [out] = demo_llm.chat([{"role": "user", "content": QUESTION}], params)
    assert out.outputs[0].finish_reason == "length"
    assert "\n\n\n\n" in out.outputs[0].text
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.outputs[0].text)
