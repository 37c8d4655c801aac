"""The toy engine's runtime half: ONNX Runtime's session over the copied graph, with the
record's options (no optimization)."""

from __future__ import annotations

from pathlib import Path

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.runtime.engines.base import HostInfo, SessionSettings
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.kv_pool import KVLayout, KVPool, kv_numpy_dtype


class ToyRuntime:
    kind = "toy"
    libraries = ("onnxruntime",)

    def problems(self, engine: EngineInfo, host: HostInfo) -> list[str]:
        return [] if host.libraries.get("onnxruntime") else ["onnxruntime is not installed"]

    def kv_layout(self, graph: GraphInfo, engine: EngineInfo) -> KVLayout:
        shape = (graph.num_layers, graph.kv_block_size, graph.num_kv_heads, graph.head_dim)
        return KVLayout(*shape, kv_numpy_dtype(graph.kv_dtype))

    def open(
        self, path: Path, engine: EngineInfo, pool: KVPool, settings: SessionSettings
    ) -> EngineSession:
        threads = 1 if settings.drafting else 0
        options = {**engine.session_options, "intra_op_num_threads": threads}
        spinning = settings.spinning and not settings.drafting
        return EngineSession(
            path, pool, options, spinning=spinning, hidden=settings.hidden, aux=settings.aux
        )


PLUGIN = ToyRuntime()
