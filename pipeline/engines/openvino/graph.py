"""The OpenVINO engine as the IR check runs it (`GraphRunner`): the runtime half's session
(runtime/engines/openvino, exactly what `ingot serve` runs) driven through the exported
graph's interface that export/check.py's throwaway pool feeds.

The check feeds padded [S, Q] rows, block tables into pools [NB, B, Hkv, D], ``kv_slots`` and
a mask; the session takes the runtime's `Batch` and attends over the block tables itself
(PagedAttention: the mask is not read). Per call: the real rows are found (a padded row sits
at position 0, a real one at context + q), a `Batch` asking the logits of every real row is
run, and its logits and hidden rows are put back at their [S*Q] rows.

The pool: the session owns a `KVPool` of the check's number of blocks, the same block ids.
f32 / f16 caches are the pool's arrays in OpenVINO's per-block order [Hkv, B, D] (the op
reads and writes them in place); the check's pools are copied in before a call and the
written blocks read back after it, so the check sees what the engine stored (and the
reference adopts its fp16 rounding ties). A u8 cache is the engine's own form (per-block
scales and zero points): nothing can be copied in or read back, so the check is shown an
fp32 pool it keeps to itself, and compares logits and hidden only (stages/engine.py: the IR
unrounded, the engine held to the loose tolerance).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.runtime.batch import Batch
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.base import EngineRunner, SessionSettings
from ingot.runtime.kv_pool import KVLayout, KVPool
from ingot.runtime.loader import local_layers

from ..base import Accuracy

__all__ = ["GRAPH_INFO", "OpenVinoGraph", "graph_interface"]

# The export stage's interface file beside model.onnx (stages/export.py `ExportOutput`).
GRAPH_INFO = "graph.json"
_POOL_DTYPES = {"f32": "float32", "f16": "float16"}  # the caches the check can read


def graph_interface(graph: Path) -> GraphInfo:
    """The interface of the exported ``graph`` (its export's graph.json)."""
    return GraphInfo.model_validate(json.loads((graph.parent / GRAPH_INFO).read_text()))


class OpenVinoGraph:
    """The runtime's OpenVINO session over ``graph`` compiled as ``record`` says (the model's
    attention window ``sliding_window`` passed as the loader passes it), as a `GraphRunner`.
    The session (a compile) opens at the first call, for the check's pool."""

    def __init__(
        self, graph: Path, record: dict[str, Any], sliding_window: int | None = None
    ) -> None:
        self.graph, self.interface = graph, graph_interface(graph)
        self.engine = EngineInfo.model_validate(record)
        self.options = record["session_options"]
        self.settings = SessionSettings(hidden=True, sliding_window=sliding_window)
        self.runtime = ENGINE_RUNTIMES.get("openvino")
        layout = self.runtime.kv_layout(_cache_interface(self.interface, self.options), self.engine)
        # A model mixing local and global layers: its local layers' pool as the runtime has it
        # (here as many blocks as the global one: the check feeds both the same tables).
        self.layout = replace(layout, local_layers=local_layers(self.interface))
        self._pool: KVPool | None = None
        self._session: EngineRunner | None = None

    @property
    def own_kv(self) -> bool:
        """The cache is the engine's own u8 form: the check cannot read it."""
        return self.options["kv_cache_precision"] not in _POOL_DTYPES

    @property
    def inputs(self) -> dict[str, tuple[tuple[int | str, ...], str]]:
        """The graph's inputs; the pools in the engine's block size, fp32 where the engine's
        cache is its own."""
        specs = {t.name: (tuple(t.shape), t.dtype) for t in self.interface.inputs}
        pool = _POOL_DTYPES.get(self.options["kv_cache_precision"], "float32")
        block = (self.layout.block_size, self.layout.num_kv_heads, self.layout.head_dim)
        for name in [n for n in specs if "_pool_" in n]:
            specs[name] = (("NB", *block), pool)
        return specs

    @property
    def accuracy(self) -> Accuracy:
        o = self.options
        exact = o["inference_precision"] == "f32" and not o["dynamic_quantization_group_size"]
        return "exact" if exact and not self.own_kv else "int8_activations"

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """logits [S*Q, V], hidden [S*Q, H] (zeros at padded rows) and the pools after the
        call (``k_pool_out_{l}`` ...), for the check's feed."""
        pools = {n: np.array(a, copy=True) for n, a in feed.items() if "_pool_" in n}
        session, pool = self._open(len(pools["k_pool_0"]))
        batch = _batch(feed, pool.block_size)
        if not self.own_kv:
            _copy_in(pools, pool, self.layout)
        logits, _ = session.run(batch)
        hidden = session.hidden  # the final-norm rows of the same logits rows
        if not self.own_kv:
            _copy_out(pool, self.layout, pools)
        rows, calls = batch.logits_indices, batch.input_ids.size
        out = {"logits": _scatter(logits, rows, calls), "hidden": _scatter(hidden, rows, calls)}
        return out | {n.replace("_pool_", "_pool_out_"): a for n, a in pools.items()}

    def _open(self, num_blocks: int) -> tuple[EngineRunner, KVPool]:
        if self._pool is None or self._pool.num_blocks != num_blocks:
            self._session = None  # the old compiled model goes first
            self._pool = self.layout.pool(num_blocks)
            self._session = self.runtime.open(self.graph, self.engine, self._pool, self.settings)
        return self._session, self._pool


def _cache_interface(interface: GraphInfo, options: dict[str, Any]) -> GraphInfo:
    """The interface whose pool holds the record's cache: the graph's own, but for the exact
    variant of an int8 graph, whose cache is f32 (an fp32 cache holds any K/V exactly; the
    runtime sizes the pool from the interface's kv_dtype and compiles for the pool's dtype)."""
    if options["kv_cache_precision"] == "f32" and interface.kv_dtype != "fp32":
        return interface.model_copy(update={"kv_dtype": "fp32", "kv_scales": None})
    return interface


def _batch(feed: Mapping[str, np.ndarray], block_size: int) -> Batch:
    """The runtime's `Batch` for the check's call: every real row's logits."""
    ids, positions, context = feed["input_ids"], feed["positions"], feed["context_lens"]
    s, q = ids.shape
    real = positions == context[:, None] + np.arange(q)  # [S, Q]: padded rows sit at 0
    rows = np.flatnonzero(real.reshape(-1))  # [T] rows s*Q + q, sequence by sequence
    seq, pos = rows // q, positions.reshape(-1)[rows]
    slots = feed["block_tables"][seq, pos // block_size] * block_size + pos % block_size
    return Batch(
        input_ids=ids,
        positions=positions,
        block_tables=feed["block_tables"],
        context_lens=context,
        attention_mask=feed["attention_mask"],
        logits_indices=rows,
        slots=slots,
        real_rows=None if len(rows) == s * q else rows,
        kv_slots=feed["kv_slots"],
        block_tables_local=feed.get("block_tables_local"),
        kv_slots_local=feed.get("kv_slots_local"),
        attention_mask_local=feed.get("attention_mask_local"),
    )


def _block_views(pool: KVPool, layout: KVLayout) -> list[tuple[str, np.ndarray]]:
    """(the check's pool name, the session's array as the op holds its float blocks:
    [NB + 1, Hkv, B, D], head-major: the runtime half's layout.py) for every cache."""
    shape = (-1, layout.num_kv_heads, layout.block_size, layout.head_dim)
    return [
        (f"{kind}_pool_{layer}", arrays[layer].reshape(shape))
        for layer in range(layout.num_layers)
        for kind, arrays in (("k", pool.k), ("v", pool.v))
    ]


def _copy_in(pools: dict[str, np.ndarray], pool: KVPool, layout: KVLayout) -> None:
    """The check's pools [NB, B, Hkv, D] into the session's caches (the scratch block last)."""
    for name, blocks in _block_views(pool, layout):
        blocks[:-1] = pools[name].transpose(0, 2, 1, 3)


def _copy_out(pool: KVPool, layout: KVLayout, pools: dict[str, np.ndarray]) -> None:
    """The session's caches (the call's K/V written) back into the check's pools."""
    for name, blocks in _block_views(pool, layout):
        pools[name][:] = blocks[:-1].transpose(0, 2, 1, 3)


def _scatter(values: np.ndarray, rows: np.ndarray, calls: int) -> np.ndarray:
    """values [N, X] of `rows` at their rows of [calls, X], zeros elsewhere."""
    out = np.zeros((calls, values.shape[-1]), dtype=np.float32)
    out[rows] = values
    return out
