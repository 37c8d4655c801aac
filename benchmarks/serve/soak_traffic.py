"""The soak benchmark's traffic: asyncio workers that each send one kind of request until told
to stop, and the tally of what came back.

Every request's outcome is a status code ("200", "400", "413", ...), or one of: "cancelled"
(the client gave up on purpose), "unanswered" (the connection was accepted and closed or reset
before a status line came), "refused" (never accepted), "stream_error" (an error event in a
stream that had started), "stream_cut" (a stream that ended without `[DONE]`), "idle_closed"
(a connection that sent nothing and was closed by the server, as it should be),
"idle_kept" (one the server left open past three keep-alive timeouts). Only 127.0.0.1 is ever
contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

__all__ = ["Probe", "Tally", "Traffic"]

CLIENT_TIMEOUT_S = 120


@dataclass
class Tally:
    """Outcomes per kind of request."""

    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, kind: str, outcome: str) -> None:
        self.counts[kind][outcome] += 1

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {kind: dict(sorted(c.items())) for kind, c in sorted(self.counts.items())}


@dataclass
class Probe:
    """One stream at a time, its gaps between content chunks."""

    gaps: list[float] = field(default_factory=list)
    streams: int = 0
    failures: list[str] = field(default_factory=list)

    async def run(self, client: httpx.AsyncClient, body: dict, until: Callable[[], bool]) -> None:
        while not until():
            last = None
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        self.failures.append(f"status {response.status_code}")
                        continue
                    async for line in response.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        now = time.perf_counter()
                        if last is not None:
                            self.gaps.append(now - last)
                        last = now
            except httpx.HTTPError as e:
                self.failures.append(repr(e))
            self.streams += 1


class Traffic:
    """The soak's workers against the server at `port`; `stop()` ends them after their current
    request."""

    def __init__(self, port: int, prompts: list[str], keep_alive_s: float) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.prompts = prompts
        self.keep_alive_s = keep_alive_s
        self.tally = Tally()
        self._stopping = False
        self._random = random.Random(0)

    def stop(self) -> None:
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def loop(self, worker: Callable[[], Awaitable[None]], pause_s: float = 0.0) -> None:
        """Run `worker` again and again (with `pause_s` between) until stopped."""
        while not self._stopping:
            await worker()
            if pause_s:
                await asyncio.sleep(self._random.uniform(0.5, 1.5) * pause_s)

    # -- well-formed traffic ---------------------------------------------------------------

    async def normal(self, client: httpx.AsyncClient) -> None:
        """A completion or a chat, streamed or not, of a random prompt and length."""
        chat, stream = self._random.random() < 0.5, self._random.random() < 0.5
        prompt = self._random.choice(self.prompts)
        body: dict = {"max_tokens": self._random.randint(8, 96), "stream": stream}
        body["temperature"] = self._random.choice([0.0, 0.8])
        body["seed"] = self._random.randint(0, 1000)
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        route = "/v1/chat/completions" if chat else "/v1/completions"
        kind = ("chat" if chat else "completion") + ("_stream" if stream else "")
        self.tally.add(kind, await _request(client, route, body, stream))

    async def cancelled(self, client: httpx.AsyncClient) -> None:
        """A stream read for a few chunks then dropped, or a request given up on before its
        answer: the server must abort it and free its slot."""
        body = {"prompt": self._random.choice(self.prompts), "max_tokens": 200, "stream": True}
        if self._random.random() < 0.5:
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    wanted = self._random.randint(1, 8)
                    async for line in response.aiter_lines():
                        wanted -= line.startswith("data: {")
                        if wanted <= 0:
                            break
                self.tally.add("cancelled_stream", "cancelled")
            except httpx.HTTPError as e:
                self.tally.add("cancelled_stream", _transport_outcome(e, started=False))
            return
        body["stream"] = False
        try:
            await client.post("/v1/completions", json=body, timeout=0.05)
            self.tally.add("cancelled_request", "answered_before_cancel")
        except httpx.TimeoutException:
            self.tally.add("cancelled_request", "cancelled")
        except httpx.HTTPError as e:
            self.tally.add("cancelled_request", _transport_outcome(e, started=False))

    # -- hostile traffic -------------------------------------------------------------------

    async def malformed(self) -> None:
        """One of a list of broken requests, each on a fresh connection."""
        name, request = self._random.choice(_MALFORMED)
        self.tally.add(f"malformed:{name}", await self._raw(request))

    async def oversized(self) -> None:
        """A body over the server's limit (declared or chunked), or a huge prompt under it."""
        choice = self._random.randrange(4)
        if choice == 0:  # 17 MB declared: refused before a byte of it is read
            head = _head("/v1/completions", f"Content-Length: {17 << 20}")
            outcome = await self._raw(head, body_chunks=[b" " * (1 << 20)] * 17)
            self.tally.add("oversized:declared_17mb", outcome)
        elif choice == 1:  # chunked past the limit: refused as it passes
            head = _head("/v1/completions", "Transfer-Encoding: chunked")
            chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
            outcome = await self._raw(head, body_chunks=[chunk] * 17)
            self.tally.add("oversized:chunked_17mb", outcome)
        else:  # 9 MB of prompt: parsed, then refused by its length alone
            route = "/tokenize" if choice == 2 else "/v1/completions"
            prompt = "hello world " * (9_000_000 // 12)
            payload = json.dumps({"prompt": prompt, "max_tokens": 4}).encode()
            head = _head(route, f"Content-Length: {len(payload)}")
            self.tally.add(f"oversized:prompt_9mb{route}", await self._raw(head + payload))

    async def slowloris(self) -> None:
        """Headers trickled a byte a second: the server must answer 408 and close."""
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.tally.add("slow:trickled_headers", "refused")
            return
        outcome = "unanswered"
        try:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nX-Slow: ")
            while time.monotonic() - started < 120:
                writer.write(b"a")
                await writer.drain()
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                except TimeoutError:
                    continue
                outcome = line.split()[1].decode() if line else "unanswered"
                break
        except (ConnectionError, IndexError):
            pass
        finally:
            writer.close()
        self.tally.add("slow:trickled_headers", outcome)

    async def slow_upload(self) -> None:
        """A valid completion uploaded at ~1 KB/s (slow but steady): it must be served."""
        padding = " " * 6000
        payload = json.dumps({"prompt": self._random.choice(self.prompts), "max_tokens": 8})
        body = (payload[:-1] + padding + "}").encode()
        head = _head("/v1/completions", f"Content-Length: {len(body)}")
        chunks = [body[i : i + 100] for i in range(0, len(body), 100)]
        self.tally.add("slow:steady_upload", await self._raw(head, chunks, pace_s=0.1))

    async def idle(self) -> None:
        """A connection that sends nothing: the server must close it after its keep-alive
        timeout."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.tally.add("slow:idle_connection", "refused")
            return
        try:
            data = await asyncio.wait_for(reader.read(1), 3 * self.keep_alive_s)
            outcome = "idle_closed" if data == b"" else "unexpected_data"
        except TimeoutError:
            outcome = "idle_kept"
        except ConnectionError:
            outcome = "idle_closed"
        finally:
            writer.close()
        self.tally.add("slow:idle_connection", outcome)

    async def _raw(
        self, request: bytes, body_chunks: Sequence[bytes] = (), pace_s: float = 0.0
    ) -> str:
        """Send `request` then `body_chunks` (each `pace_s` apart) on a fresh connection while
        waiting for the status line; its code, or what happened instead."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return "refused"

        async def send() -> None:
            writer.write(request)
            for chunk in body_chunks:
                await writer.drain()
                if pace_s:
                    await asyncio.sleep(pace_s)
                writer.write(chunk)
            await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            line = await asyncio.wait_for(reader.readline(), CLIENT_TIMEOUT_S)
            return line.split()[1].decode() if line else "unanswered"
        except (ConnectionError, TimeoutError, IndexError):
            return "unanswered"
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
            writer.close()


async def _request(client: httpx.AsyncClient, route: str, body: dict, stream: bool) -> str:
    started = False
    try:
        if not stream:
            response = await client.post(route, json=body)
            return str(response.status_code)
        async with client.stream("POST", route, json=body) as response:
            started = True
            if response.status_code != 200:
                return str(response.status_code)
            events = [line async for line in response.aiter_lines() if line.startswith("data:")]
        if events and events[-1] == "data: [DONE]":
            errors = [e for e in events if e.startswith('data: {"error"')]
            return "stream_error" if errors else "200"
        return "stream_cut"
    except httpx.HTTPError as e:
        return _transport_outcome(e, started)


def _transport_outcome(error: httpx.HTTPError, started: bool) -> str:
    if isinstance(error, httpx.ConnectError):
        return "refused"
    if started:
        return "stream_cut"
    return "unanswered"


def _head(route: str, *headers: str) -> bytes:
    lines = [f"POST {route} HTTP/1.1", "Host: soak", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _with_body(route: str, body: bytes, *headers: str) -> bytes:
    return _head(route, f"Content-Length: {len(body)}", *headers) + body


_MALFORMED: list[tuple[str, bytes]] = [
    ("truncated_json", _with_body("/v1/completions", b'{"prompt": "abc", "max_tokens": ')),
    ("not_json", _with_body("/v1/completions", b"not json at all")),
    ("wrong_type", _with_body("/v1/completions", b'{"prompt": {"a": 1}}')),
    ("out_of_range", _with_body("/v1/completions", b'{"prompt": "a", "max_tokens": -1}')),
    ("unknown_model", _with_body("/v1/completions", b'{"model": "nope", "prompt": "a"}')),
    ("lone_surrogate", _with_body("/v1/completions", b'{"prompt": "a \\ud800 b"}')),
    ("invalid_utf8", _with_body("/v1/chat/completions", b'{"messages": "\xff\xfe"}')),
    ("chat_no_messages", _with_body("/v1/chat/completions", b'{"messages": []}')),
    ("bad_tokens", _with_body("/detokenize", b'{"tokens": [-5]}')),
    ("unknown_route", _with_body("/v1/nowhere", b"{}")),
    ("wrong_method", b"DELETE /v1/completions HTTP/1.1\r\nHost: soak\r\n\r\n"),
    (
        "content_length_and_chunked",
        _head("/v1/completions", "Content-Length: 4", "Transfer-Encoding: chunked")
        + b"2\r\n{}\r\n0\r\n\r\n",
    ),
    (
        "huge_request_id",
        b"GET /v1/models HTTP/1.1\r\nHost: soak\r\nX-Request-Id: " + b"r" * 60_000 + b"\r\n\r\n",
    ),
    ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n"),
]
