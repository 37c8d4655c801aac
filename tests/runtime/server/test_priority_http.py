"""The request `priority` field (vLLM's extension, completions and chat): an int64 handed to the
generator with every sample of the request; anything else is a 400 naming it."""

from __future__ import annotations

import asyncio

import pytest
from test_async_llm import _client

from server_support import fake_llm

COMPLETION = {"prompt": [65, 66, 67], "max_tokens": 2, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


def _post_all(tmp_path, requests: list[tuple[str, dict]]) -> tuple[list, list[int]]:
    """Responses to `requests` (path, body) in turn, and the priorities Generator.add got."""
    llm, _ = fake_llm(tmp_path)
    given: list[int] = []

    async def main():
        async with _client(llm) as client:
            generator = llm.model.generator
            add = generator.add

            def recording(prompt_ids, params=None, request_id=None, priority=0):
                given.append(priority)
                return add(prompt_ids, params, request_id, priority=priority)

            generator.add = recording
            return [await client.post(path, json=body) for path, body in requests]

    return asyncio.run(main()), given


def test_priority_reaches_the_generator_for_every_sample(tmp_path):
    responses, given = _post_all(
        tmp_path,
        [
            ("/v1/completions", {**COMPLETION, "priority": -3, "n": 2}),
            ("/v1/chat/completions", {**CHAT, "priority": 7}),
            ("/v1/completions", COMPLETION),
        ],
    )
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert given == [-3, -3, 7, 0]


@pytest.mark.parametrize("value", ["1", 1.5, True, 2**63, -(2**63) - 1])
def test_a_priority_that_is_not_an_int64_is_a_400_naming_it(tmp_path, value):
    [response], given = _post_all(
        tmp_path, [("/v1/completions", {**COMPLETION, "priority": value})]
    )
    assert response.status_code == 400 and given == []
    assert response.json()["error"]["param"] == "priority"
