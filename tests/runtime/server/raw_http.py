"""A minimal HTTP/1.1 client over one raw socket, for tests that must know the connection was
kept: a client library reconnects silently when the server closes it, and sends only bodies
it can encode itself (a lone surrogate goes over the wire only as a JSON "\\ud800" escape)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 30


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawConnection:
    """One keep-alive connection; `request` raises ConnectionError if the server closed it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self._buffer = b""

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body: bytes | None = None) -> RawResponse:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall((head + "\r\n").encode("latin-1") + (body or b""))
        status_line, headers = self._head()
        if headers.get("transfer-encoding") == "chunked":
            content = self._chunked()
        else:
            content = self._exactly(int(headers.get("content-length", "0")))
        return RawResponse(int(status_line.split()[1]), headers, content)

    def post_json(self, path: str, body: Any) -> RawResponse:
        """`body` as JSON: json.dumps writes a lone surrogate as its \\ud800 escape."""
        return self.request("POST", path, json.dumps(body).encode("ascii"))

    def _head(self) -> tuple[str, dict[str, str]]:
        while b"\r\n\r\n" not in self._buffer:
            self._receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status_line, headers

    def _chunked(self) -> bytes:
        content = b""
        while True:
            size = int(self._line().split(";")[0], 16)
            content += self._exactly(size)
            self._line()  # the CRLF after the chunk (or the empty trailer)
            if size == 0:
                return content

    def _line(self) -> str:
        while b"\r\n" not in self._buffer:
            self._receive()
        line, self._buffer = self._buffer.split(b"\r\n", 1)
        return line.decode("latin-1")

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._receive()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data
