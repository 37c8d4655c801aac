"""`ingot serve` as a real process under signals: every connection accepted around a SIGTERM
gets an answer (no reset), a second signal aborts what runs and exits at once, non-zero, and a
clean stop says nothing about signals."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from ingot.runtime.server import create_app
from ingot.runtime.server.launch import ServeOptions, uvicorn_config
from ingot.runtime.server.server import IngotServer

from server_support import MODEL, GuardedServer, fake_llm, free_port, wait_healthy

INGOT = str(Path(sys.executable).parent / "ingot")  # the console script beside python
EXIT_TIMEOUT_S = 30


def serve(artifact: Path, port: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [INGOT, "serve", str(artifact), "--port", str(port), "--kv-cache-memory", "4MiB", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(process: subprocess.Popen) -> str:
    try:
        output, _ = process.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return output


def completion_request(body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )


def raw_request(port: int, body: dict) -> str:
    """One request on a fresh connection: 'refused' (never accepted), the status line's code,
    or what went wrong after the connection was accepted ('reset', 'no response')."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=EXIT_TIMEOUT_S)
    except ConnectionRefusedError:
        return "refused"
    with sock:
        return exchange(sock, completion_request(body))


def exchange(sock: socket.socket, request: bytes) -> str:
    try:
        sock.sendall(request)
        response = sock.recv(4096)
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    return response.split(b" ", 2)[1].decode() if response else "no response"


def test_a_connection_accepted_before_sigterm_gets_its_request_answered(artifact):
    """uvicorn closed a connection with no request yet the moment it shut down, so a request
    on its way met a reset; such a connection now has FRESH_GRACE_S to send it (a 503)."""
    port = free_port()
    process = serve(artifact, port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
        time.sleep(0.3)  # accepted by the server
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the server is shutting down
        request = completion_request({"prompt": "def", "max_tokens": 2})
        results = [exchange(sock, request) for sock in sockets]
        for sock in sockets:
            sock.close()
    finally:
        output = stop(process)
    assert results == ["503"] * 5, output
    assert process.returncode == 0, output


def test_every_connection_accepted_around_sigterm_is_answered(artifact):
    port = free_port()
    process = serve(artifact, port, "--shutdown-grace", "10")
    results: list[str] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        body = {"prompt": "def", "max_tokens": 20, "ignore_eos": True}
        clients = []
        for i in range(60):
            client = threading.Thread(target=lambda: results.append(raw_request(port, body)))
            client.start()
            clients.append(client)
            if i == 20:
                process.send_signal(signal.SIGTERM)
            time.sleep(0.01)
        for client in clients:
            client.join(EXIT_TIMEOUT_S)
    finally:
        output = stop(process)
    assert process.returncode == 0, output
    assert len(results) == 60
    answered = [r for r in results if r != "refused"]
    assert set(answered) <= {"200", "503"}, results
    assert results.count("200") >= 20  # those before the signal ran to the end


def test_a_second_sigterm_exits_at_once_and_non_zero(artifact):
    port = free_port()
    process = serve(artifact, port, "--shutdown-grace", "60")
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        # A request whose body never comes holds the drain (up to --request-read-timeout).
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n")
            time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert process.poll() is None  # draining: waiting for the stalled request
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(EXIT_TIMEOUT_S)
            exited_after = time.monotonic() - signalled
    finally:
        output = stop(process)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert exited_after < 3, output
    assert output.splitlines()[-1] == (
        "ingot serve: stopped by a second SIGTERM; requests still running were aborted"
    )


def test_a_clean_stop_says_nothing_about_signals(artifact):
    port = free_port()
    process = serve(artifact, port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        process.send_signal(signal.SIGTERM)
    finally:
        output = stop(process)
    assert process.returncode == 0, output
    assert "signal" not in output.lower(), output
    assert output.splitlines()[-1].endswith("server stopped")


def test_connections_queued_in_the_kernel_at_shutdown_are_answered(tmp_path):
    """Connections the kernel accepted while the event loop was busy, not yet taken by it,
    were reset when uvicorn closed its listening socket; IngotServer takes them first."""
    llm, _ = fake_llm(tmp_path)
    options = ServeOptions(port=free_port(), log_level="warning", shutdown_grace=2.0)
    server = IngotServer(uvicorn_config(create_app(llm, MODEL), options), llm, 2.0)
    request = completion_request({"prompt": "def", "max_tokens": 2})
    results: list[str] = []

    def client() -> None:
        with socket.create_connection(("127.0.0.1", options.port), timeout=10) as sock:
            results.append(exchange(sock, request))

    async def scenario() -> list[threading.Thread]:
        server.config.load()  # what uvicorn.Server.serve does before startup
        server.lifespan = server.config.lifespan_class(server.config)
        await server.startup()
        while not llm.ready:
            await asyncio.sleep(0.05)
        clients = [threading.Thread(target=client) for _ in range(5)]
        for thread in clients:
            thread.start()
        time.sleep(0.5)  # the loop is blocked: the kernel queues the connections and requests
        server.handle_exit(signal.SIGTERM, None)
        await server.shutdown()
        return clients

    for thread in asyncio.run(scenario()):
        thread.join(EXIT_TIMEOUT_S)
    assert results == ["503"] * 5


def test_a_second_signal_ends_a_started_stream_with_an_error_event(tmp_path):
    llm, session = fake_llm(tmp_path)
    events: list[str] = []
    with GuardedServer(llm, shutdown_grace=60) as server:
        session.hold_after(3)  # the stream has started when the generator stops

        def stream() -> None:
            body = {"prompt": [65], "max_tokens": 20, "stream": True}
            with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
                events.extend(line for line in r.iter_lines() if line.startswith("data: "))

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while not session.held:  # until the generator holds, mid-stream
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.server.handle_exit(signal.SIGTERM, None)  # drain: the stream may run 60 s
        server.server.handle_exit(signal.SIGTERM, None)  # abort
        session.release()
        client.join(EXIT_TIMEOUT_S)
        server.thread.join(EXIT_TIMEOUT_S)
        assert not server.thread.is_alive()
    assert server.server.forced_by == signal.SIGTERM
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "shut down" in events[-2], events[-3:]
    assert any('"text"' in e for e in events[:-2])  # it had streamed before
