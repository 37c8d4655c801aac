"""`ingot serve`: load an artifact behind the HTTP API and run uvicorn until SIGTERM.

The server listens at once and loads the artifact in the generator thread (verify, open the
session, size the KV pool, one warm-up generation), so /health answers 503 until the model is
ready; uvicorn's own start-up lines are printed once it is (server.py). On SIGTERM or SIGINT
it stops admitting (503), lets requests in flight finish for up to `shutdown_grace` seconds,
aborts the rest and exits 0; a second signal aborts what runs at once and `run_server` raises
ForcedShutdown. If loading fails (a KV cache too small, an artifact that does not verify, no
engine for this host), it stops at once and `run_server` raises what loading raised: a server
that can never become ready must not sit at 503.

Connections are uvicorn's h11 protocol with idle and read timeouts (connection.py).
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

from ingot.common.errors import IngotError
from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS
from ingot.runtime.model import LoadedModel
from ingot.runtime.server.app import create_app
from ingot.runtime.server.async_llm import AsyncLLM
from ingot.runtime.server.connection import DEFAULT_READ_TIMEOUT_S, GuardedH11Protocol
from ingot.runtime.server.metrics import Metrics
from ingot.runtime.server.middleware import DEFAULT_MAX_REQUEST_BYTES
from ingot.runtime.server.server import IngotServer
from ingot.runtime.server.stream import ServedModel

__all__ = ["ForcedShutdown", "ServeOptions", "load_served_model", "run_server", "uvicorn_config"]

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
    scheduling_policy: str = "fcfs"  # or "priority": by each request's `priority`
    verify_key: Path | None = None  # PEM public key model.sig must verify against
    request_timeout: float | None = None  # seconds; None = no deadline
    shutdown_grace: float = 30.0
    log_level: str = "info"
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413
    chat_template: str | None = None  # template source replacing the artifact's
    # vLLM's speculative_config dict; None: the artifact's recipe; False: off
    speculative_config: dict[str, Any] | bool | None = None
    max_tokenize_tokens: int | None = None  # /tokenize's limit; None: the model's max_seq_len
    keep_alive_timeout: float = 5.0  # seconds an idle connection stays open (uvicorn's, vLLM's)
    engine: str | None = None  # the artifact's engine by name or kind; None: its preference
    request_read_timeout: float = DEFAULT_READ_TIMEOUT_S  # + 1 s per 500 bytes received


class ForcedShutdown(IngotError):
    """A second shutdown signal stopped the server before what ran had finished."""

    def __init__(self, sig: int) -> None:
        name = signal.Signals(sig).name
        super().__init__(f"stopped by a second {name}; requests still running were aborted")
        self.signal = sig


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
    engine: str | None = None,
    scheduling_policy: str = "fcfs",
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
        engine=engine,
        scheduling_policy=scheduling_policy,
    )
    info = loaded.manifest.model
    return ServedModel(
        generator=loaded.generator(),
        tokenizer=loaded.tokenizer,
        max_model_len=info.max_seq_len,
        max_num_seqs=max_num_seqs,
        max_tokenize_tokens=max_tokenize_tokens,
    )


def run_server(artifact: Path | str, model_name: str, options: ServeOptions) -> None:
    """Serve `artifact` as `model_name` until a shutdown signal; returns after a clean stop.
    If loading the artifact fails, the server stops and this raises what loading raised; a
    second signal raises ForcedShutdown."""
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
        engine=options.engine,
        scheduling_policy=options.scheduling_policy,
    )
    llm = AsyncLLM(
        load,
        Metrics(model_name),
        max_queue=options.max_queue,
        request_timeout=options.request_timeout,
    )
    app = create_app(llm, model_name, max_request_bytes=options.max_request_bytes)
    # uvicorn restores the handlers it found once it has shut down: no-ops, so a signal that
    # comes while the process exits does not kill it half way.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    server = IngotServer(uvicorn_config(app, options), llm, options.shutdown_grace)
    server.run()
    if llm.load_error is not None:
        raise llm.load_error
    if server.forced_by is not None:
        raise ForcedShutdown(server.forced_by)
    log.info("server stopped")


def uvicorn_config(app: Any, options: ServeOptions) -> uvicorn.Config:
    """uvicorn's settings for `app` under `options`: ingot's h11 protocol with its timeouts,
    no access log, and a graceful-shutdown backstop past the grace period."""
    return uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        http=partial(GuardedH11Protocol, read_timeout=options.request_read_timeout),
        timeout_keep_alive=options.keep_alive_timeout,
        # AsyncLLM ends what runs past the grace period (503); uvicorn's own timeout is
        # only the backstop for a connection that still does not close.
        timeout_graceful_shutdown=options.shutdown_grace + _BACKSTOP_S,
        access_log=False,
    )


def _ignore(sig: int, frame: FrameType | None) -> None:
    pass
