"""uvicorn's HTTP/1.1 connection (h11), with the timeouts and the shutdown a public server needs.

uvicorn closes a connection idle *after* a response (`timeout_keep_alive`) but nothing else:
a client that connects and sends nothing, or trickles its headers or body a byte at a time
(slowloris), holds its connection, and a task, for as long as it likes. `GuardedH11Protocol`
adds:

- idle: a connection that has sent nothing of a request for `timeout_keep_alive` seconds is
  closed, before its first request as after one;
- read: from its first byte, a request's headers and body must arrive within
  `read_timeout` seconds, plus one second per `MIN_READ_RATE` bytes received (Apache
  mod_reqtimeout's rule and defaults: a slow but steady upload is never cut, a trickle is);
  past that the client gets a 408 and the connection is closed. The clock stops while the
  server is not reading (the app has not taken the body yet) and once the request is in:
  generating the response takes as long as it takes;
- shutdown: uvicorn closes every connection that is not mid-response at once, so a request
  whose bytes were in flight met a reset (ECONNRESET, no response). Here a connection that is
  reading a request, or that was just accepted and has not sent one yet (for `FRESH_GRACE_S`),
  stays open and gets its answer (a 503 while the server drains) with `Connection: close`;
- lingering close: an answer given before the request's body was read (a 413) closes the
  connection while the client may still be uploading. Closing a socket with unread bytes sends
  a TCP reset, and a client whose write fails on it may never read the answer (the soak
  benchmark saw 2 in 33 such uploads end unanswered). As Apache and nginx do, the server sends
  its FIN after the answer and reads and drops what still comes for up to `LINGER_S`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ingot.runtime.server.protocol import APIError

__all__ = [
    "DEFAULT_READ_TIMEOUT_S",
    "FRESH_GRACE_S",
    "LINGER_S",
    "MIN_READ_RATE",
    "GuardedH11Protocol",
]

DEFAULT_READ_TIMEOUT_S = 20.0  # Apache mod_reqtimeout: header=20-40,MinRate=500 body=20,MinRate=500
MIN_READ_RATE = 500  # bytes a second that earn a request one more second to arrive
# At shutdown, how long a connection accepted but not yet heard from has to send its request
# (a client writes its request right after connecting: this covers the bytes in flight).
FRESH_GRACE_S = 1.0
LINGER_S = 2.0  # Apache's lingering close: how long a refused upload is read and dropped

# h11 states in which the client is sending a request: a partial head (IDLE with bytes
# buffered) or the body.
_READING = (h11.IDLE, h11.SEND_BODY)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with idle and read timeouts, and a shutdown that answers what it accepted.

    uvicorn builds one per connection with its own keyword arguments; `read_timeout` comes
    through `functools.partial` (launch.py)."""

    def __init__(self, *args: Any, read_timeout: float = DEFAULT_READ_TIMEOUT_S, **kw: Any):
        super().__init__(*args, **kw)
        self.read_timeout = read_timeout
        self._read_started: float | None = None  # monotonic time of the request's first byte
        self._read_bytes = 0
        self._read_timer: asyncio.TimerHandle | None = None
        self._served = 0  # requests answered on this connection
        self._closing_after_response = False  # set by shutdown(): no keep-alive

    # -- uvicorn's hooks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # Every close uvicorn makes (its request cycles hold the transport) goes through it.
        lingering = _LingeringTransport(transport, self._client_sending_body)
        super().connection_made(lingering)  # type: ignore[arg-type]
        self._arm_idle(self.timeout_keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_read_clock()
        self.transport.stop_lingering()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            return  # the rest of a body the answer refused: dropped
        if self._read_started is None:
            self._read_started = time.monotonic()
            self._read_bytes = 0
        self._read_bytes += len(data)
        super().data_received(data)  # handle_events updates the clock

    def handle_events(self) -> None:
        super().handle_events()
        if self._closing_after_response and self.cycle is not None:
            self.cycle.keep_alive = False
        self._update_read_clock()

    def on_response_complete(self) -> None:
        self._served += 1
        super().on_response_complete()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close an idle connection; let one that is reading a
        request, or was just accepted, get its response first (then it closes)."""
        self._closing_after_response = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # mid-request: uvicorn's own behaviour
        elif self._read_started is not None:
            pass  # a request is arriving: handle_events marks its cycle not to keep alive
        elif self._served == 0:
            self._arm_idle(FRESH_GRACE_S)  # its request may be in flight
        else:
            super().shutdown()

    def _client_sending_body(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    # -- timers ----------------------------------------------------------------------------

    def _arm_idle(self, seconds: float) -> None:
        """Close the connection after `seconds` unless data arrives (uvicorn's keep-alive
        timer, which data_received cancels)."""
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            seconds, self.timeout_keep_alive_handler
        )

    def _update_read_clock(self) -> None:
        state = self.conn.their_state
        partial_head = state is h11.IDLE and bool(self.conn.trailing_data[0])
        if state in _READING and (state is h11.SEND_BODY or partial_head):
            if self._read_started is None:  # the next request's bytes came with the last one
                self._read_started, self._read_bytes = time.monotonic(), 0
            if self._read_timer is None:
                self._schedule_read_check()
        else:
            self._stop_read_clock()

    def _read_deadline(self) -> float:
        assert self._read_started is not None
        return self._read_started + self.read_timeout + self._read_bytes / MIN_READ_RATE

    def _schedule_read_check(self) -> None:
        delay = max(0.0, self._read_deadline() - time.monotonic())
        self._read_timer = self.loop.call_later(delay, self._check_read)

    def _stop_read_clock(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._read_started = None

    def _check_read(self) -> None:
        self._read_timer = None
        if self._read_started is None or self.transport.is_closing():
            return
        if self.flow.read_paused or time.monotonic() < self._read_deadline():
            self._schedule_read_check()  # the server is not reading, or the client kept up
            return
        self._read_timed_out()

    def _read_timed_out(self) -> None:
        """408 and close: the request did not arrive in time."""
        self._read_started = None
        started = False
        if self.cycle is not None and not self.cycle.response_complete:
            started = self.cycle.response_started
            self.cycle.disconnected = True  # the app's receive() now says http.disconnect
            self.cycle.message_event.set()
        if not started and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(_timeout_response(self.conn))
        self.transport.close_now()  # a trickle: nothing to linger for


class _LingeringTransport:
    """A connection's transport whose `close()` lingers while the client is still sending a
    body that will not be read (module docstring); everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, sending_body: Callable[[], bool]) -> None:
        self._transport = transport
        self._sending_body = sending_body
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        transport = self._transport
        if self.lingering or transport.is_closing():
            return
        if not self._sending_body() or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()  # the answer, then FIN: the client can read all of it
        except OSError:  # the client already reset the connection: nothing to linger for
            transport.close()
            return
        self.lingering = True
        transport.resume_reading()  # what still comes is read and dropped
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(LINGER_S, transport.close)

    def close_now(self) -> None:
        self.stop_lingering()
        self._transport.close()

    def stop_lingering(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _timeout_response(conn: h11.Connection) -> bytes:
    error = APIError(
        408,
        "the request did not arrive in time (a slow or stalled upload); the connection is closed",
        type="timeout_error",
        code="request_read_timeout",
    )
    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return b"".join(
        [
            conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout")),
            conn.send(h11.Data(data=body)),
            conn.send(h11.EndOfMessage()),
        ]
    )
