"""Server test support: a live uvicorn server on 127.0.0.1, and the real Generator over a fake
session (next token = last token + 1) that tests can hold or break, so the server's queueing,
deadlines and failures can be driven exactly."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import uvicorn
from hypothesis import HealthCheck, settings

from ingot.runtime.generate import Generator, GeneratorConfig
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.server import (
    AsyncLLM,
    Metrics,
    ServedModel,
    create_app,
    load_served_model,
)
from ingot.runtime.server.launch import ServeOptions, uvicorn_config
from ingot.runtime.server.server import IngotServer
from ingot.runtime.tokenizer import TextTokenizer

from fixtures import CHAT_TEMPLATE, write_tokenizer

MODEL = "tiny"
STARTUP_TIMEOUT_S = 60
V = 320
MAX_LEN = 64
HOLD_TIMEOUT_S = 30  # a held session never blocks a test for longer


class FakeSession:
    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.calls = 0  # runs started
        self.fail_after: int | None = None  # runs that succeed before every run raises
        self.hold_at: int | None = None  # the run that holds the session when it starts
        self._go = threading.Event()
        self._go.set()

    def hold(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()

    @property
    def held(self) -> bool:
        return not self._go.is_set()

    def break_after(self, runs: int) -> None:
        """Let `runs` more runs succeed, then fail every one."""
        self.fail_after = self.calls + runs

    def hold_after(self, runs: int) -> None:
        """Let `runs` more runs go, then hold (until `release`)."""
        self.hold_at = self.calls + runs + 1

    def run(self, batch):
        input_ids = batch.input_ids
        self.calls += 1
        if self.calls == self.hold_at:
            self.hold()
        self._go.wait(HOLD_TIMEOUT_S)
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("the fake session broke")
        S, Q = input_ids.shape
        logits = np.zeros((S, Q, V), np.float32)
        np.put_along_axis(logits, ((input_ids + 1) % V)[..., None], 10.0, axis=-1)
        kv = np.zeros((S, Q, 1, 2), np.float32)
        return logits.reshape(S * Q, V)[batch.logits_indices], [(kv, kv)]


def fake_llm(
    tmp_path: Path,
    *,
    chat_template: str | None = CHAT_TEMPLATE,
    max_num_seqs: int = 4,
    max_queue: int = 8,
    load_gate: threading.Event | None = None,
    max_tokenize_tokens: int | None = None,
    **llm_options,
) -> tuple[AsyncLLM, FakeSession]:
    write_tokenizer(tmp_path, V)
    tokenizer = TextTokenizer(tmp_path / "tokenizer.json", chat_template, "<s>", "</s>")
    pool = KVPool(num_layers=1, num_blocks=64, block_size=4, num_kv_heads=1, head_dim=2)
    session = FakeSession(pool)
    config = GeneratorConfig(
        max_seq_len=MAX_LEN, eos_token_ids=(1,), max_num_seqs=max_num_seqs, vocab_size=V
    )

    def load() -> ServedModel:
        if load_gate is not None:
            load_gate.wait(HOLD_TIMEOUT_S)
        generator = Generator(session, pool, tokenizer, config)
        return ServedModel(generator, tokenizer, MAX_LEN, max_num_seqs, max_tokenize_tokens)

    llm = AsyncLLM(load, Metrics("fake"), max_queue=max_queue, **llm_options)
    return llm, session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} not healthy within {timeout} s")


class LiveServer:
    """uvicorn in a thread (no signal handlers there), stopped by `should_exit`."""

    def __init__(self, llm: AsyncLLM) -> None:
        self.llm = llm
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(llm, MODEL),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_healthy(self.base_url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class GuardedServer(LiveServer):
    """LiveServer with `ingot serve`'s uvicorn settings and server class (timeouts, drain,
    abort on a second signal: `server.handle_exit` stands for the signals)."""

    def __init__(
        self, llm: AsyncLLM, keep_alive: float = 5.0, read_timeout: float = 20.0, **options
    ) -> None:
        super().__init__(llm)
        serve = ServeOptions(
            port=self.port,
            log_level="warning",
            keep_alive_timeout=keep_alive,
            request_read_timeout=read_timeout,
            **options,
        )
        config = uvicorn_config(create_app(llm, MODEL), serve)
        self.server = IngotServer(config, llm, serve.shutdown_grace)
        self.thread = threading.Thread(target=self.server.run, daemon=True)


def artifact_llm(
    artifact: Path, max_num_seqs: int = 8, max_queue: int = 256, speculative_config=None, **kw
) -> AsyncLLM:
    def load():
        return load_served_model(
            artifact,
            kv_cache_bytes=4 << 20,
            max_num_seqs=max_num_seqs,
            speculative_config=speculative_config,
        )

    return AsyncLLM(load, Metrics(MODEL), max_queue=max_queue, **kw)


def fuzz_settings(max_examples: int) -> settings:
    """Hypothesis settings for tests against a live server: no deadline (a request's time is
    the server's), no example database (every run draws afresh), no health checks (the
    fixtures are slow by nature)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
