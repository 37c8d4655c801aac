"""Perplexity of a built engine: the graph ONNX Runtime runs, through the runtime's own pieces.

The float and quantized perplexities are the IR's, computed in torch; what ships is the engine,
whose MatMulNBits may quantize activations to int8 (`matmul_accuracy_level: 4`). This scores
the engine on the same windows, in numpy, through the graph interface (docs/design.md,
section 4) as the runtime drives it: `KVPool`, `build_inputs`, `EngineSession`. Each window is
one call, a prefill of seq_len tokens into a throwaway pool (blocks for one window, zero-filled,
never written: a single prefill attends only to its own new K/V), with ``logits_indices`` =
every row, so the call returns logits [seq_len, V]; NLL accumulates in float64.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["engine_perplexity", "engine_pool_layout"]

# onnx.TensorProto FLOAT, FLOAT16, INT8, UINT8 (an fp8 pool: E4M3FN bytes) -> the pool's dtype
_KV_TYPES = {1: np.float32, 10: np.float16, 3: np.int8, 2: np.uint8}
_ROWS_PER_CHUNK = 64  # rows of logits converted to float64 at a time (large vocabularies)


def engine_pool_layout(engine_file: Path) -> dict[str, Any]:
    """num_layers, block_size, num_kv_heads, head_dim and the numpy KV dtype of an engine's
    pool inputs (``k_pool_{l}`` [NB, B, Hkv, D]), read from the graph without its weights."""
    import onnx

    graph = onnx.load(str(engine_file), load_external_data=False).graph
    pools = {i.name: i for i in graph.input if i.name.startswith(("k_pool_", "v_pool_"))}
    if "k_pool_0" not in pools:
        raise ValueError(f"{engine_file}: no k_pool_0 input: not an ingot decoder graph")
    tensor = pools["k_pool_0"].type.tensor_type
    _, block, heads, dim = (d.dim_value for d in tensor.shape.dim)
    if tensor.elem_type not in _KV_TYPES or min(block, heads, dim) < 1:
        raise ValueError(
            f"{engine_file}: k_pool_0 is not [NB, B, Hkv, D] float, float16, int8 or uint8"
        )
    return {
        "num_layers": len(pools) // 2,
        "block_size": block,
        "num_kv_heads": heads,
        "head_dim": dim,
        "dtype": _KV_TYPES[tensor.elem_type],
    }


def engine_perplexity(
    engine_file: Path, session_options: dict[str, Any], windows: np.ndarray
) -> float:
    """exp(mean next-token NLL) of the engine over ``windows`` [W, L] int64, each window one
    call (the same windows and the same L - 1 predictions per window as `perplexity`)."""
    from ingot.runtime.batch import build_inputs
    from ingot.runtime.kv_pool import BlockTable, KVPool
    from ingot.runtime.session import EngineSession

    windows = np.asarray(windows, dtype=np.int64)
    count, length = windows.shape
    layout = engine_pool_layout(engine_file)
    block = layout["block_size"]
    pool = KVPool(
        layout["num_layers"],
        -(-length // block),  # one window's blocks
        block,
        layout["num_kv_heads"],
        layout["head_dim"],
        layout["dtype"],
    )
    session = EngineSession(engine_file, pool, session_options)
    total = 0.0  # float64: thousands of windows would lose digits in fp32
    try:
        for ids in windows:
            table = BlockTable(pool.allocator, block)
            table.reserve(length)
            batch = build_inputs([(table, ids.tolist(), 0)], scratch_block=session.scratch_block)
            batch.logits_indices = np.arange(length, dtype=np.int64)  # every row, not the last
            logits, _ = session.run(batch)  # [L, V]
            total += _nll(logits[:-1], ids[1:])
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
