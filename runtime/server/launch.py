"""`ingot serve`: load an artifact behind the HTTP API and run uvicorn until SIGTERM.

The server listens at once and loads the artifact in the generator thread (verify, open the
session, size the KV pool, one warm-up generation), so /health answers 503 until the model is
ready. On SIGTERM or SIGINT it stops admitting (503), lets requests in flight finish for up to
`shutdown_grace` seconds, aborts the rest and exits 0. If loading fails (a KV cache too small,
an artifact that does not verify, no engine for this host), it stops at once and `run_server`
raises what loading raised: a server that can never become ready must not sit at 503.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS
from ingot.runtime.model import LoadedModel
from ingot.runtime.server.app import create_app
from ingot.runtime.server.async_llm import AsyncLLM
from ingot.runtime.server.metrics import Metrics
from ingot.runtime.server.middleware import DEFAULT_MAX_REQUEST_BYTES
from ingot.runtime.server.stream import ServedModel

__all__ = ["ServeOptions", "load_served_model", "run_server"]

log = logging.getLogger(__name__)

_BACKSTOP_S = 5.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_queue: int = 64
    kv_cache_bytes: int | None = None  # None: auto (LoadedModel.load)
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    verify_key: Path | None = None  # PEM public key model.sig must verify against
    request_timeout: float | None = None  # seconds; None = no deadline
    shutdown_grace: float = 30.0
    log_level: str = "info"
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413
    chat_template: str | None = None  # template source replacing the artifact's
    # vLLM's speculative_config dict; None: the artifact's recipe; False: off
    speculative_config: dict[str, Any] | bool | None = None
    max_tokenize_tokens: int | None = None  # /tokenize's limit; None: the model's max_seq_len


def load_served_model(
    artifact: Path | str,
    kv_cache_bytes: int | None,
    max_num_seqs: int,
    *,
    max_num_batched_tokens: int = 2048,
    enable_prefix_caching: bool = True,
    verify_key: Path | None = None,
    chat_template: str | None = None,
    speculative_config: dict[str, Any] | bool | None = None,
    spinning: bool = True,
    max_tokenize_tokens: int | None = None,
) -> ServedModel:
    """Verify and load `artifact` (LoadedModel.load logs the engine and the KV pool size);
    `kv_cache_bytes=None` sizes the KV cache from available memory; /tokenize refuses more
    than `max_tokenize_tokens` (None: the model's max_seq_len)."""
    loaded = LoadedModel.load(
        artifact,
        kv_cache_bytes=kv_cache_bytes,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        verify_key=verify_key,
        chat_template=chat_template,
        speculative_config=speculative_config,
        spinning=spinning,
    )
    info = loaded.manifest.model
    return ServedModel(
        generator=loaded.generator(),
        tokenizer=loaded.tokenizer,
        max_model_len=info.max_seq_len,
        max_num_seqs=max_num_seqs,
        max_tokenize_tokens=max_tokenize_tokens,
    )


class _DrainingServer(uvicorn.Server):
    """uvicorn, but a shutdown signal first makes AsyncLLM refuse new requests (503)."""

    def __init__(self, config: uvicorn.Config, llm: AsyncLLM, grace: float) -> None:
        super().__init__(config)
        self.llm = llm
        self.grace = grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.llm.begin_drain(self.grace)
        super().handle_exit(sig, frame)

    def load_failed(self, error: BaseException) -> None:
        """From the generator thread: stop serving (uvicorn polls `should_exit`)."""
        log.error("loading the model failed; stopping the server")
        self.should_exit = True


def run_server(artifact: Path | str, model_name: str, options: ServeOptions) -> None:
    """Serve `artifact` as `model_name` until a shutdown signal; returns after a clean stop.
    If loading the artifact fails, the server stops and this raises what loading raised."""
    logging.basicConfig(
        level=options.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    load = partial(
        load_served_model,
        artifact,
        options.kv_cache_bytes,
        options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        enable_prefix_caching=options.enable_prefix_caching,
        verify_key=options.verify_key,
        chat_template=options.chat_template,
        speculative_config=options.speculative_config,
        max_tokenize_tokens=options.max_tokenize_tokens,
    )
    llm = AsyncLLM(
        load,
        Metrics(model_name),
        max_queue=options.max_queue,
        request_timeout=options.request_timeout,
    )
    config = uvicorn.Config(
        create_app(llm, model_name, max_request_bytes=options.max_request_bytes),
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        # AsyncLLM ends what runs past the grace period (503); uvicorn's own timeout is
        # only the backstop for a connection that still does not close.
        timeout_graceful_shutdown=options.shutdown_grace + _BACKSTOP_S,
        access_log=False,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down; with these no-op
    # handlers restored under it, that re-raise is harmless and a drained server exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    server = _DrainingServer(config, llm, options.shutdown_grace)
    llm.on_load_failure = server.load_failed
    server.run()
    if llm.load_error is not None:
        raise llm.load_error
    log.info("server stopped")


def _ignore(sig: int, frame: FrameType | None) -> None:
    log.info("signal %d after shutdown ignored", sig)
