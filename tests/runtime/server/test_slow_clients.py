"""Connections as `ingot serve` runs them (launch.uvicorn_config: ingot's h11 protocol), with
raw sockets: an idle connection is closed after the keep-alive timeout, before its first
request too; a request whose headers or body trickle in gets a 408 and is closed within the
read timeout, while a slow but steady upload is served; a body framed both by Content-Length
and Transfer-Encoding is refused; an X-Request-Id too long to echo is replaced."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time

import httpx
import pytest

from ingot.runtime.server.connection import MIN_READ_RATE, _LingeringTransport
from ingot.runtime.server.middleware import MAX_REQUEST_ID_CHARS

from server_support import GuardedServer, fake_llm

KEEP_ALIVE_S = 0.5
READ_TIMEOUT_S = 1.0
SLACK_S = 1.5  # scheduling on a loaded 2-core machine


@pytest.fixture
def server(tmp_path):
    llm, _ = fake_llm(tmp_path)
    with GuardedServer(llm, KEEP_ALIVE_S, READ_TIMEOUT_S) as server:
        yield server


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def test_an_idle_connection_is_closed_before_its_first_request(server):
    with connect(server) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""
        elapsed = time.monotonic() - started
    assert KEEP_ALIVE_S * 0.8 < elapsed < KEEP_ALIVE_S + SLACK_S


def test_trickled_headers_get_408_within_the_read_timeout(server):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(head)
        sock.settimeout(0.25)
        response = b""
        while not response and time.monotonic() - started < 10:
            try:
                sock.send(b"a")  # a byte each 0.25 s: far below MIN_READ_RATE
                response = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        elapsed = time.monotonic() - started
    sent = len(head) + elapsed * 4
    assert elapsed < READ_TIMEOUT_S + sent / MIN_READ_RATE + SLACK_S
    assert status_of(response) == 408
    assert b"connection: close" in response.lower()
    assert json_body(response)["error"]["code"] == "request_read_timeout"


def test_a_trickled_body_gets_408_and_the_connection_closes(server):
    body = json.dumps({"prompt": [5] * 200, "max_tokens": 1}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with connect(server) as sock:
        sock.sendall(head + body[:10])
        started = time.monotonic()
        sock.settimeout(0.2)
        response, i = b"", 10
        while not response and i < len(body):
            try:
                sock.send(body[i : i + 1])
                i += 1
                response = sock.recv(65536)
            except TimeoutError:
                continue
        sock.settimeout(10)
        response += read_all(sock)  # then the server closes the connection
        elapsed = time.monotonic() - started
    assert i < len(body)  # cut before the body was complete
    assert status_of(response) == 408
    assert elapsed < READ_TIMEOUT_S + (len(head) + i) / MIN_READ_RATE + SLACK_S


def test_a_slow_but_steady_upload_is_served(server):
    """~1 KB/s for 3 s, three times the read timeout: above the minimum rate, never cut."""
    prompt = "a" * 2900
    body = json.dumps({"prompt": prompt}).encode()
    head = (
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(head)
        for i in range(0, len(body), 100):
            sock.sendall(body[i : i + 100])
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        sock.settimeout(10)
        response = sock.recv(65536)
    assert elapsed > 2 * READ_TIMEOUT_S
    # /tokenize's own limit answers (this prompt is over the fake model's 64 tokens): the
    # request was read whole and handled.
    assert status_of(response) == 400, response
    assert "tokenizes at most 64 tokens" in json_body(response)["error"]["message"]


def test_a_response_taking_longer_than_the_read_timeout_is_not_cut(tmp_path):
    """The clock stops once the request is in: generating may take as long as it takes."""
    llm, session = fake_llm(tmp_path)
    with GuardedServer(llm, KEEP_ALIVE_S, READ_TIMEOUT_S) as server:
        session.hold()
        answer: list[httpx.Response] = []
        body = {"prompt": [65], "max_tokens": 3}
        url = f"{server.base_url}/v1/completions"
        client = threading.Thread(target=lambda: answer.append(httpx.post(url, json=body)))
        client.start()
        time.sleep(READ_TIMEOUT_S + KEEP_ALIVE_S + 0.5)
        session.release()
        client.join(30)
    assert answer[0].status_code == 200, answer[0].text


def test_content_length_with_transfer_encoding_is_refused(server):
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\nPOST /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    with connect(server) as sock:
        sock.sendall(request)
        response = read_all(sock)  # one response, then the connection closes
    assert response.count(b"HTTP/1.1") == 1
    assert status_of(response) == 400
    assert json_body(response)["error"]["code"] == "ambiguous_request_framing"


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        ("r" * MAX_REQUEST_ID_CHARS, True),
        ("r" * (MAX_REQUEST_ID_CHARS + 1), False),
        ("x" * 100_000, False),
        ("caf\u00e9", False),  # latin-1 on the wire: not printable ASCII
    ],
)
def test_an_overlong_request_id_is_replaced(server, sent, echoed):
    r = httpx.get(f"{server.base_url}/health", headers={"X-Request-Id": sent.encode("latin-1")})
    assert r.status_code == 200
    if echoed:
        assert r.headers["x-request-id"] == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])


def test_a_refused_upload_gets_its_413_while_the_client_still_writes(server):
    """The 413 for a declared 17 MiB body goes out before the body is read. Closed at once,
    with the client's bytes still arriving, the socket sends a TCP reset; an asyncio client
    whose write fails on it closes its transport and never reads the answer (the soak saw 2
    in 33). The server sends its FIN after the answer and reads and drops the rest instead
    (a lingering close)."""

    async def upload() -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(17 << 20).encode() + b"\r\n\r\n"
        )

        async def send() -> None:
            writer.write(head)
            for _ in range(17):
                await writer.drain()
                writer.write(b" " * (1 << 20))
            await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
            return line.split()[1].decode() if line else "closed"
        except ConnectionError as e:
            return type(e).__name__
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
            writer.close()

    async def uploads() -> list[str]:
        return [await upload() for _ in range(20)]

    assert asyncio.run(uploads()) == ["413"] * 20


def test_a_client_that_uploads_a_refused_body_whole_still_reads_its_413(server):
    """httpx sends the whole body before it reads the answer: the lingering close must not
    keep it from the 413 (the server drops the upload, then closes)."""
    body = b" " * (17 << 20)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        statuses = [client.post("/v1/completions", content=body).status_code for _ in range(3)]
    assert statuses == [413] * 3


def test_a_client_that_reset_first_is_closed_without_lingering():
    """A client may reset while its 413 is written: the FIN then fails (ENOTCONN), and the
    close must not raise into the app (the dense soak traffic logged 88 tracebacks in 150 s
    before this was handled)."""

    class ResetTransport:
        closed = False

        def is_closing(self) -> bool:
            return self.closed

        def can_write_eof(self) -> bool:
            return True

        def write_eof(self) -> None:
            raise OSError(107, "Transport endpoint is not connected")

        def close(self) -> None:
            self.closed = True

    transport = ResetTransport()
    lingering = _LingeringTransport(transport, lambda: True)  # type: ignore[arg-type]
    lingering.close()
    assert transport.closed
    assert not lingering.lingering
