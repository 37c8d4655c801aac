"""Perplexity of a built engine: the graph it runs, through the runtime's own loader.

The float and quantized perplexities are the IR's, computed in torch; what ships is the engine,
which may not compute exactly (ONNX Runtime's MatMulNBits at `matmul_accuracy_level: 4`
quantize activations to int8). This scores the engine on the same windows, in numpy, through
the graph interface (docs/design.md, section 4) as the runtime drives it: `open_engine` (the
engine kind's runtime plug-in: the pool it declares, its session) and `build_inputs`. Each
window is one call, a prefill of seq_len tokens into a throwaway pool (blocks for one window,
zero-filled, never written: a single prefill attends only to its own new K/V), with
``logits_indices`` = every row, so the call returns logits [seq_len, V]; NLL accumulates in
float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ingot.runtime.batch import LocalLayers, build_inputs
from ingot.runtime.loader import EngineFiles, open_engine

__all__ = ["engine_perplexity"]

_ROWS_PER_CHUNK = 64  # rows of logits converted to float64 at a time (large vocabularies)


def engine_perplexity(
    engine: EngineFiles,
    windows: np.ndarray,
    on_logits: Callable[[int, np.ndarray], None] | None = None,
) -> float:
    """exp(mean next-token NLL) of ``engine`` over ``windows`` [W, L] int64, each window one
    call (the same windows and the same L - 1 predictions per window as `perplexity`).
    ``on_logits(index, logits)`` sees each window's logits [1, L, V] (`perplexity`'s shape)."""
    windows = np.asarray(windows, dtype=np.int64)
    count, length = windows.shape
    block = engine.kv_layout().block_size
    opened = open_engine(engine, -(-length // block))  # one window's blocks
    pool, session = opened.pool, opened.session
    del opened
    total = 0.0  # float64: thousands of windows would lose digits in fp32
    window, local = engine.sliding_window, None
    if pool.local_scratch_block is not None:  # local layers: the window is theirs only
        window, local = None, LocalLayers(engine.sliding_window, pool.local_scratch_block)
    try:
        for index, ids in enumerate(windows):
            table = pool.new_block_table()
            table.reserve(length)
            feed = [(table, ids.tolist(), 0)]
            batch = build_inputs(feed, window, scratch_block=session.scratch_block, local=local)
            batch.logits_indices = np.arange(length, dtype=np.int64)  # every row, not the last
            logits, _ = session.run(batch)  # [L, V]
            total += _nll(logits[:-1], ids[1:])
            if on_logits is not None:
                on_logits(index, logits[None])
            table.release()
    finally:
        del session
    return math.exp(total / (count * (length - 1)))


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed -log softmax(logits)[target] over rows, in float64."""
    total = 0.0
    for start in range(0, len(targets), _ROWS_PER_CHUNK):
        rows = logits[start : start + _ROWS_PER_CHUNK].astype(np.float64)
        top = rows.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(rows - top).sum(axis=-1)) + top[:, 0]
        picked = rows[np.arange(len(rows)), targets[start : start + _ROWS_PER_CHUNK]]
        total += float((lse - picked).sum())
    return total
