"""Continuous usage in a chat stream (vLLM's stream_options.continuous_usage_stats): every
chunk carries the usage so far; each choice's role chunk comes before any token, so it counts
no completion tokens, as vLLM's does."""

from __future__ import annotations

import openai
import pytest

from server_support import MODEL


@pytest.fixture(scope="module")
def client(live_server):
    with openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.mark.parametrize("n", [1, 2])
def test_chat_role_chunk_counts_no_completion_tokens(client, n):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        n=n,
        max_tokens=5,
        temperature=0.9,
        seed=3,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    final = chunks[-1].usage
    assert not chunks[-1].choices and final.completion_tokens == 5 * n
    counts: dict[int, list[int]] = {}
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        usage = chunk.usage
        assert usage.prompt_tokens == final.prompt_tokens
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        if choice.delta.role:
            assert usage.completion_tokens == 0, chunk
            assert choice.index not in counts  # one role chunk per choice, its first
        counts.setdefault(choice.index, []).append(usage.completion_tokens)
    assert sorted(counts) == list(range(n))
    for index, seen in counts.items():  # this choice's tokens so far, up to all of them
        assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 5, (index, seen)
