"""uvicorn's Server with ingot's start-up and shutdown: quiet until the model is ready, a drain
on the first signal, an abort on the second, and no accepted connection left unanswered.

- Start-up: uvicorn announces itself ("Uvicorn running on ...") as soon as it listens, while
  the model still loads. Its INFO records are held (`StartupLogs`) until the model is ready
  and printed then; if loading fails they are dropped, so the failure is the one line the
  caller prints, not a dozen lines of a server that never served.
- First SIGTERM / SIGINT: AsyncLLM admits nothing new (503) and gives what runs `grace`
  seconds; uvicorn stops listening. Connections the kernel had accepted but uvicorn had not
  yet taken are taken first (`_take_pending`), so each gets its answer (a 503) instead of a
  reset when the listening socket closes.
- Second signal: what runs ends now (a 503, or an error event in a stream already started),
  uvicorn stops waiting after `FORCE_FLUSH_S` (time to write those), and `forced_by` says
  which signal it was: the caller exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from ingot.runtime.server.async_llm import AsyncLLM

__all__ = ["FORCE_FLUSH_S", "IngotServer", "StartupLogs"]

log = logging.getLogger(__name__)

FORCE_FLUSH_S = 0.5  # after a second signal: time to write the aborted requests' answers


class StartupLogs(logging.Filter):
    """Once attached, holds a logger's records below WARNING until `release` (printed then,
    in order) or `discard` (dropped, as is everything below WARNING after it)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self._logger = logger
        self._lock = threading.Lock()  # released from the generator thread
        self._held: list[logging.LogRecord] | None = []  # None: passing records through
        self._discarding = False

    def attach(self) -> None:
        self._logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        with self._lock:
            if self._held is None:
                return not self._discarding
            self._held.append(record)
            return False

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
        self._logger.removeFilter(self)
        for record in held:
            self._logger.handle(record)

    def discard(self) -> None:
        with self._lock:
            self._held, self._discarding = None, True

    def detach(self) -> None:
        """Stop filtering (what is still held is dropped): the server has stopped."""
        self._logger.removeFilter(self)


class IngotServer(uvicorn.Server):
    """uvicorn.Server whose first shutdown signal drains AsyncLLM and whose second aborts."""

    def __init__(self, config: uvicorn.Config, llm: AsyncLLM, grace: float) -> None:
        super().__init__(config)
        self.llm = llm
        self.grace = grace
        self.forced_by: int | None = None  # the second signal, if one came
        self._force_at: float | None = None
        self.startup_logs = StartupLogs(logging.getLogger("uvicorn.error"))
        llm.on_ready = self.startup_logs.release
        llm.on_load_failure = self.load_failed

    # uvicorn polls `force_exit` while it waits for connections and tasks; after a second
    # signal it turns true FORCE_FLUSH_S later, once the aborted requests had time to answer.
    @property
    def force_exit(self) -> bool:
        return self._force_at is not None and time.monotonic() >= self._force_at

    @force_exit.setter
    def force_exit(self, value: bool) -> None:
        self._force_at = time.monotonic() if value else None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.startup_logs.attach()
        try:
            await super().serve(sockets)
        finally:
            self.startup_logs.detach()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.llm.begin_drain(self.grace)
            self.should_exit = True
            return
        if self.forced_by is None:
            self.forced_by = sig
            name = signal.Signals(sig).name
            log.warning("second %s: aborting %d requests in flight", name, self.llm.num_open)
            self.llm.begin_drain(0.0)
            self._force_at = time.monotonic() + FORCE_FLUSH_S

    def load_failed(self, error: BaseException) -> None:
        """From the generator thread: stop serving (uvicorn polls `should_exit`); the caller
        reports `error`, so uvicorn's start-up and shutdown lines are dropped."""
        self.startup_logs.discard()
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._take_pending()
        await super().shutdown(sockets)

    async def _take_pending(self) -> None:
        """Stop listening, but first take every connection the kernel already accepted: a
        listening socket closed over them resets them, unanswered."""
        loop = asyncio.get_running_loop()
        # Duplicates keep each socket listening while asyncio lets go of its own.
        listeners = [
            socket.socket(fileno=os.dup(s.fileno())) for srv in self.servers for s in srv.sockets
        ]
        for server in self.servers:
            server.close()  # asyncio stops accepting (close again in super(): a no-op)
        accepted = []
        for listener in listeners:
            with listener:  # closed right after its queue is empty
                listener.setblocking(False)
                accepted += _accept_all(listener)
        for conn in accepted:
            await loop.connect_accepted_socket(self._protocol, conn)

    def _protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(  # what uvicorn's startup builds per connection
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )


def _accept_all(listener: socket.socket) -> list[socket.socket]:
    accepted = []
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return accepted
        except ConnectionAbortedError:  # reset by its client while queued
            continue
        conn.setblocking(False)
        accepted.append(conn)
