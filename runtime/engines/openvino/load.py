"""Open an OpenVINO engine: rebuild the decoder from the exported graph's weights, compile it on
the CPU plugin with the record's options, and bind the pool (session.py).

The model cannot be shipped built: an IR holding PagedAttention does not read back ("unsupported
opset: extension", docs/spikes/issue27-openvino.md), so it is built at every load from the
artifact's portable graph, whose initializers are the weights (weights.py).
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import openvino as ov

from ingot.runtime.engines.base import SessionSettings
from ingot.runtime.engines.openvino.graph import ModelShape, build_model
from ingot.runtime.engines.openvino.options import CompileOptions
from ingot.runtime.engines.openvino.session import OpenVinoSession
from ingot.runtime.engines.openvino.weights import GraphWeights
from ingot.runtime.kv_pool import KVPool

__all__ = ["open_session"]

log = logging.getLogger(__name__)


def open_session(
    graph: Path, options: CompileOptions, kv_precision: str, pool: KVPool, settings: SessionSettings
) -> OpenVinoSession:
    """The exported graph at `graph` compiled with `options` (caches of `kv_precision`) over
    `pool`, with the outputs `settings` ask for."""
    started = time.perf_counter()
    weights = GraphWeights(graph)
    shape = ModelShape.of(weights, settings.sliding_window, settings.aux, pool.local_layers)
    model = build_model(weights, shape, hidden=settings.hidden)
    built = time.perf_counter()
    # A draft beside the target: one thread, so the two do not share the cores' threads.
    threads = 1 if settings.drafting else None
    compiled = ov.Core().compile_model(model, "CPU", options.properties(kv_precision, threads))
    del weights, model  # the compiled model holds what it needs
    gc.collect()
    log.info(
        "openvino: built the model in %.2fs, compiled it in %.2fs",
        built - started,
        time.perf_counter() - built,
    )
    return OpenVinoSession(compiled, pool)
