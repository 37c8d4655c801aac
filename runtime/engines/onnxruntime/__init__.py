"""The ONNX Runtime CPU engine's runtime half: the record's requirements checked against the
host (compat.py), the pool its graph reads (the graph interface's, as exported), and the
session that runs it with the pool bound in place (session.py; options.py, buffers.py), its
weights file read ahead as it opens (readahead.py).

Imports the runtime's engine interface (engines/base.py), its batch and KV pool, ingot.artifacts,
numpy and onnxruntime; never onnx or torch (the runtime install has neither).
"""

from __future__ import annotations

from pathlib import Path

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.runtime.engines.base import HostInfo, SessionSettings
from ingot.runtime.engines.onnxruntime.compat import problems
from ingot.runtime.engines.onnxruntime.readahead import read_ahead
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.engines.resident import ResidentMemory, ResidentModel, ServingShape
from ingot.runtime.kv_pool import KVLayout, KVPool, kv_numpy_dtype

__all__ = ["PLUGIN", "OnnxRuntimeEngine"]

# Fitted to `ingot serve` with its KV cache full (the demo and the 1B shape, RTN int4,
# --max-num-batched-tokens 2048, 2 threads; checked in benchmarks/results/serving_plan.md): its
# RSS once loaded, less the pool, demo 129 MiB, 1B 1018 MiB (the engine's files: 7 and 870
# MiB); what filling the cache added, over one step's attention scores: demo 4.5x, 1B 5.0x.
RESIDENT = ResidentModel(
    base_bytes=122 << 20,
    weights_factor=1.03,
    attention_buffers=5.0,
    source="fitted in benchmarks/results/serving_plan.md",
)


class OnnxRuntimeEngine:
    """`EngineRuntime` for ``engines[].engine == "onnxruntime"``."""

    kind = "onnxruntime"
    libraries = ("onnxruntime",)

    def problems(self, engine: EngineInfo, host: HostInfo) -> list[str]:
        return problems(engine, host)

    def kv_layout(self, graph: GraphInfo, engine: EngineInfo) -> KVLayout:
        # The engine is the exported graph optimized: its pool inputs are the graph's.
        shape = (graph.num_layers, graph.kv_block_size, graph.num_kv_heads, graph.head_dim)
        return KVLayout(*shape, kv_numpy_dtype(graph.kv_dtype))

    def resident_memory(self, engine: EngineInfo, shape: ServingShape) -> ResidentMemory:
        return RESIDENT.estimate(shape)

    def open(
        self, path: Path, engine: EngineInfo, pool: KVPool, settings: SessionSettings
    ) -> EngineSession:
        options, spinning = engine.session_options, settings.spinning
        if settings.drafting:
            # One thread that does not spin between calls: a second thread pool beside the
            # target's would share its cores (4 threads on 2 cores made the target's one-token
            # call 1.4x slower: benchmarks/results/speculative.md), and a draft is small enough
            # that one thread runs it about as fast.
            options, spinning = {**options, "intra_op_num_threads": 1}, False
        read_ahead(path)  # the weights stream in while the session is made
        return EngineSession(
            path,
            pool,
            options,
            profile_file_prefix=settings.profile_file_prefix,
            spinning=spinning,
            hidden=settings.hidden,
            aux=settings.aux,
        )


PLUGIN = OnnxRuntimeEngine()
