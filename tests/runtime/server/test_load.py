"""A bounded load test on 127.0.0.1: 200 requests from 64 concurrent clients, random prompt and
output lengths, a third streamed and some of those dropped mid-stream. Every request ends with
a full answer, a 503 or a clean abort; nothing is a 500; afterwards every KV block is free and
the server is still healthy."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from server_support import MODEL, LiveServer, artifact_llm

NUM_REQUESTS = 200
CONCURRENCY = 64
REQUEST_TIMEOUT_S = 30
TEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server(artifact):
    # A small running set and queue, so 64 clients also exercise admission control (503).
    with LiveServer(artifact_llm(artifact, max_num_seqs=16, max_queue=24)) as server:
        yield server


def _request(rng: random.Random) -> tuple[dict, int | None]:
    """A request body and, for a stream the client drops, after how many events."""
    body = {
        "model": MODEL,
        "prompt": [rng.randrange(2, 320) for _ in range(rng.randint(1, 60))],
        "max_tokens": rng.randint(1, 24),
        "temperature": rng.choice([0.0, 0.8]),
        "seed": rng.randrange(1000),
    }
    if rng.random() < 0.5:
        body["prompt"] = "def add(a, b):\n    return a + b\n" * rng.randint(1, 3)
    drop_after = None
    if rng.random() < 0.35:
        body["stream"] = True
        if rng.random() < 0.4:
            drop_after = rng.randint(1, 4)
            # Still generating when dropped: a stream that ends within the events read could
            # finish before its abort arrives, and the test would count no abort (a race).
            body["max_tokens"] = drop_after + 32
    return body, drop_after


async def _one(client: httpx.AsyncClient, body: dict, drop_after: int | None) -> str:
    if not body.get("stream"):
        response = await client.post("/v1/completions", json=body)
        if response.status_code == 503:
            assert response.headers["retry-after"]
            return "503"
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= result["usage"]["completion_tokens"] <= body["max_tokens"]
        return "full"
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code == 503:
            return "503"
        assert response.status_code == 200
        events = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if drop_after is not None and len(events) >= drop_after and events[-1] != "[DONE]":
                return "dropped"  # leaving the block closes the connection mid-stream
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    return "full"


async def _load(base_url: str) -> list[str]:
    rng = random.Random(0)
    work = [_request(rng) for _ in range(NUM_REQUESTS)]
    outcomes: list[str] = []
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:

        async def worker():
            while work:
                body, drop_after = work.pop()
                outcomes.append(await _one(client, body, drop_after))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return outcomes


def test_load_ends_clean(server):
    outcomes = asyncio.run(asyncio.wait_for(_load(server.base_url), TEST_TIMEOUT_S))
    assert len(outcomes) == NUM_REQUESTS
    assert outcomes.count("full") >= NUM_REQUESTS // 2, outcomes
    assert outcomes.count("dropped") > 0

    llm = server.llm
    deadline = time.monotonic() + 10
    while True:  # aborts of dropped streams land within a step or two
        stats = llm.stats
        idle = stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0
        if idle and llm.num_open == 0:
            break
        assert time.monotonic() < deadline, (stats, llm.num_open)
        time.sleep(0.05)
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.0' in metrics
    assert f'vllm:num_requests_running{{model_name="{MODEL}"}} 0.0' in metrics
    # Dropped streams were aborted in the generator, not left to run to the end.
    aborted = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'
    assert float(metrics.split(aborted)[1].split()[0]) > 0
