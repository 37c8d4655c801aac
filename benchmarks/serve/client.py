"""The serve benchmark's HTTP client: streamed /v1/completions at given arrival times.

Each request streams (SSE) with usage, greedy, EOS ignored; the time of every content chunk is
a token time (the server sends one chunk per generated token unless the text is still
incomplete, as vLLM's benchmark also assumes). Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import httpx

from benchmarks.serve.workload import RequestTiming

__all__ = ["run_requests", "run_sequential", "wait_healthy"]

REQUEST_TIMEOUT_S = 600


def wait_healthy(
    base_url: str, timeout_s: float = 120, process: subprocess.Popen | None = None
) -> None:
    """Until GET /health answers 200; RuntimeError as soon as `process` (the server) exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before it was healthy")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{base_url} did not become healthy in {timeout_s:g} s")


async def _one(
    client: httpx.AsyncClient, prompt: list[int], output_len: int, delay: float, t0: float
) -> RequestTiming:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    body = {
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    times: list[float] = []
    output_tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                output_tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(time.perf_counter())
    return RequestTiming(len(prompt), start, times, output_tokens)


async def _all(
    base_url: str, prompts: list[list[int]], output_len: int, offsets: list[float]
) -> list[RequestTiming]:
    limits = httpx.Limits(max_connections=len(prompts) + 1)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        t0 = time.perf_counter()
        return await asyncio.gather(
            *(_one(client, p, output_len, d, t0) for p, d in zip(prompts, offsets, strict=True))
        )


def run_requests(
    base_url: str, prompts: list[list[int]], output_len: int, offsets: list[float]
) -> list[RequestTiming]:
    """Send prompts[i] at offsets[i] seconds from now; each timed from its own send."""
    return asyncio.run(_all(base_url, prompts, output_len, offsets))


def run_sequential(base_url: str, prompts: list[list[int]], output_len: int) -> list[RequestTiming]:
    """One request at a time (for TTFT without queueing), over one connection kept open, as
    an API client keeps it (vLLM's benchmark sends every request through one session too).
    A new client per request would add its set-up between requests (tens of ms with httpx),
    which the output tok/s of the run then counts against the server."""
    return asyncio.run(_sequential(base_url, prompts, output_len))


async def _sequential(
    base_url: str, prompts: list[list[int]], output_len: int
) -> list[RequestTiming]:
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        return [await _one(client, p, output_len, 0.0, time.perf_counter()) for p in prompts]
