"""AsyncLLM under control: admission (503), loading, deadlines, disconnects, failures.

Each test drives the real Generator over a fake session it can hold or break, through the ASGI
app in process (httpx.ASGITransport), so every case is exact and takes well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from contextlib import asynccontextmanager

import httpx
import pytest

from ingot.runtime.sampling import SamplingParams
from ingot.runtime.server import create_app
from ingot.runtime.server.protocol import APIError
from ingot.runtime.server.stream import RequestDelta, RequestStream

from server_support import fake_llm

PROMPT = [65, 66, 67]
BODY = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
WAIT_S = 10
_SCOPE = {  # a POST /v1/completions as a server hands it to the app (ASGI 2.3)
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/completions",
    "raw_path": b"/v1/completions",
    "query_string": b"",
    "root_path": "",
    "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
    "client": ("127.0.0.1", 1),
    "server": ("test", 80),
}


async def _until(condition, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def _client(llm, wait_ready: bool = True):
    app = create_app(llm, "fake")
    llm.start()  # ASGITransport runs no lifespan
    try:
        if wait_ready:
            await _until(lambda: llm.ready)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
    finally:
        llm.shutdown()


def _idle(llm) -> bool:
    stats = llm.stats
    return (
        llm.num_open == 0
        and stats.num_running == 0
        and stats.num_waiting == 0
        and stats.kv_cache_usage == 0
    )


def test_full_queue_gets_503_with_retry_after(tmp_path):
    llm, session = fake_llm(tmp_path, max_num_seqs=1, max_queue=1)

    async def main():
        async with _client(llm) as client:
            session.hold()
            admitted = [asyncio.create_task(client.post("/v1/completions", json=BODY))]
            admitted.append(asyncio.create_task(client.post("/v1/completions", json=BODY)))
            await _until(lambda: llm.num_open == 2)
            refused = await client.post("/v1/completions", json=BODY)
            session.release()
            done = await asyncio.gather(*admitted)
            await _until(lambda: _idle(llm))
            return refused, done

    refused, done = asyncio.run(main())
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert "capacity" in error["message"] and error["type"] == "service_unavailable"
    assert [r.status_code for r in done] == [200, 200]
    assert all(r.json()["choices"][0]["text"] == "cdef" for r in done)  # next = last + 1


def test_health_is_503_until_loaded_and_warmed(tmp_path):
    gate = threading.Event()
    llm, _ = fake_llm(tmp_path, load_gate=gate)

    async def main():
        async with _client(llm, wait_ready=False) as client:
            loading = await client.get("/health")
            refused = await client.post("/v1/completions", json=BODY)
            models = await client.get("/v1/models")
            gate.set()
            await _until(lambda: llm.ready)
            ready = await client.get("/health")
            answered = await client.post("/v1/completions", json=BODY)
            return loading, refused, models, ready, answered

    loading, refused, models, ready, answered = asyncio.run(main())
    assert loading.status_code == 503 and "loading" in loading.json()["error"]["message"]
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake"
    assert ready.status_code == 200 and answered.status_code == 200


def test_deadline_aborts_the_request_and_frees_its_blocks(tmp_path):
    llm, session = fake_llm(tmp_path, request_timeout=0.3)

    async def main():
        async with _client(llm) as client:
            session.hold()
            response = await client.post("/v1/completions", json=BODY)
            session.release()
            await _until(lambda: _idle(llm))
            return response

    response = asyncio.run(main())
    assert response.status_code == 408
    assert response.json()["error"]["code"] == "request_timeout"


def test_client_disconnect_cancels_a_non_streaming_request(tmp_path):
    llm, session = fake_llm(tmp_path)
    app = create_app(llm, "fake")
    body = json.dumps({**BODY, "max_tokens": 30}).encode()
    sent: list[dict] = []

    async def main():
        llm.start()
        await _until(lambda: llm.ready)
        session.hold()
        runs_before = session.calls
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            await _until(lambda: session.calls > runs_before)  # it is in the generator
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(app(_SCOPE, receive, send), WAIT_S)
        session.release()
        await _until(lambda: _idle(llm))
        llm.shutdown()

    asyncio.run(main())
    # The handler was cancelled: no answer was sent and the generator stopped generating it.
    assert sent[0]["status"] == 499
    assert _generated_tokens(llm) < 30


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_client_disconnect_aborts_a_streaming_request(tmp_path, spec_version):
    """No chunk polls for a disconnect: the StreamingResponse sees it (ASGI 2.3: the
    http.disconnect message; 2.4: a send that raises OSError) and its close aborts the request."""
    llm, session = fake_llm(tmp_path)
    app = create_app(llm, "fake")
    body = json.dumps({**BODY, "max_tokens": 40, "stream": True}).encode()
    sent: list[dict] = []

    async def main():
        llm.start()
        await _until(lambda: llm.ready)
        session.hold_after(3)  # the request stays live: 3 tokens, then the session waits
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            if spec_version == "2.3":  # the client leaves once the first chunk has come
                await _until(lambda: any(m.get("body") for m in sent))
                return {"type": "http.disconnect"}
            await asyncio.Event().wait()  # 2.4: the app does not listen; sending fails

        async def send(message):
            if spec_version == "2.4" and message["type"] == "http.response.body":
                raise OSError("the client went away")
            sent.append(message)

        scope = {**_SCOPE, "asgi": {"version": "3.0", "spec_version": spec_version}}
        with contextlib.suppress(Exception):  # 2.4: starlette raises ClientDisconnect
            await asyncio.wait_for(app(scope, receive, send), WAIT_S)
        await _until(lambda: llm.num_open == 0)  # closed (aborted) while the session held
        session.release()
        await _until(lambda: _idle(llm))
        llm.shutdown()

    asyncio.run(main())
    assert sent[0]["status"] == 200
    assert _generated_tokens(llm) <= 4  # aborted, not run to max_tokens


def test_next_batch_takes_what_is_queued_and_raises_an_error_behind_it():
    async def main():
        stream = RequestStream([1], SamplingParams(max_tokens=8), None)
        deltas = [RequestDelta([t], str(t), None, None, 1, t) for t in (1, 2, 3)]
        error = APIError(500, "boom")
        stream._put_all([*deltas, error])
        batch = await stream.next_batch()
        with pytest.raises(APIError):
            await stream.next_batch()
        return batch, stream.finished

    batch, finished = asyncio.run(main())
    assert [d.token_ids for d in batch] == [[1], [2], [3]]
    assert finished


def _generated_tokens(llm) -> float:
    text = llm.metrics.render().decode()
    [line] = [x for x in text.splitlines() if x.startswith("vllm:generation_tokens_total")]
    return float(line.split()[-1])


def test_a_failed_step_fails_requests_with_500_and_health_503(tmp_path):
    llm, session = fake_llm(tmp_path)

    async def main():
        async with _client(llm) as client:
            session.break_after(0)
            failed = await client.post("/v1/completions", json=BODY)
            health = await client.get("/health")
            after = await client.post("/v1/completions", json=BODY)
            return failed, health, after

    failed, health, after = asyncio.run(main())
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "server_error"
    assert "fake session broke" in failed.json()["error"]["message"]
    assert health.status_code == 503
    assert after.status_code == 500


def test_a_bad_request_does_not_disturb_the_others(tmp_path):
    llm, session = fake_llm(tmp_path)

    async def main():
        async with _client(llm) as client:
            session.hold()
            good = asyncio.create_task(client.post("/v1/completions", json=BODY))
            await _until(lambda: llm.num_open == 1)
            bad = [
                asyncio.create_task(client.post("/v1/completions", json={"prompt": [999]})),
                asyncio.create_task(client.post("/v1/completions", json={"prompt": ""})),
            ]
            await _until(lambda: llm.num_open == 3)
            session.release()
            return await good, await asyncio.gather(*bad)

    good, bad = asyncio.run(main())
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == "cdef"
    assert [r.status_code for r in bad] == [400, 400]
    assert "token ids" in bad[0].json()["error"]["message"]


def test_streaming_after_a_failed_step_ends_with_an_error_event(tmp_path):
    llm, session = fake_llm(tmp_path)

    async def main():
        async with _client(llm) as client:
            body = {**BODY, "max_tokens": 20, "stream": True}
            session.break_after(3)  # the response has started when the session breaks
            async with client.stream("POST", "/v1/completions", json=body) as response:
                lines = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                return response.status_code, lines

    status, lines = asyncio.run(main())
    assert status == 200
    assert lines[-1] == "[DONE]"
    assert "error" in json.loads(lines[-2])
