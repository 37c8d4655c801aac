"""The OpenVINO CPU engine's runtime half: ingot's decoder rebuilt at load from the artifact's
portable graph (its weights, as exported) around OpenVINO's PagedAttention, which reads and
writes ingot's KV pool in place through ingot's block tables.

The record (the build half, pipeline/engines/openvino, writes it): ``path`` the portable graph
(model.onnx), ``requires`` {"openvino": a version spec, "cpu_isa": [...]} (compat.py),
``session_options`` the compile options (options.py). The pool: layout.py. The model: graph.py
(weights.py, paged_attention.py); the session: session.py (feed.py); opening: load.py.

Imports the runtime's engine interface, its batch and KV pool, ingot.artifacts and numpy; openvino
only when a session opens (load.py and the modules it imports), so a host without it still
reads `problems` ("openvino is not installed"); never onnx or torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.runtime.engines.base import HostInfo, SessionError, SessionSettings
from ingot.runtime.engines.openvino.compat import problems
from ingot.runtime.engines.openvino.layout import kv_layout
from ingot.runtime.engines.openvino.options import CompileOptions
from ingot.runtime.engines.resident import ResidentMemory, ResidentModel, ServingShape
from ingot.runtime.kv_pool import KVLayout, KVPool

if TYPE_CHECKING:
    from ingot.runtime.engines.openvino.session import OpenVinoSession

__all__ = ["PLUGIN", "OpenVinoEngine"]

# Fitted to `ingot serve` with its KV cache full (the demo and the 1B shape, RTN int4,
# --max-num-batched-tokens 2048, 2 threads; checked in benchmarks/results/serving_plan.md): its
# RSS once loaded, less the pool, demo 179 MiB, 1B 2376 MiB (the portable graph's files, 7 and
# 870 MiB: kept mapped, plus the compiled model's own copy); what filling the cache added, over
# one step's attention scores: demo 2.0x, 1B 2.1x.
RESIDENT = ResidentModel(
    base_bytes=161 << 20,
    weights_factor=2.55,
    attention_buffers=2.1,
    source="fitted in benchmarks/results/serving_plan.md",
)

# The pool's numpy dtype -> the cache precision it holds (layout.CACHE_DTYPES reversed).
_PRECISION_OF = {"float32": "f32", "float16": "f16", "uint8": "u8"}


class OpenVinoEngine:
    """`EngineRuntime` for ``engines[].engine == "openvino"``."""

    kind = "openvino"
    libraries = ("openvino",)

    def problems(self, engine: EngineInfo, host: HostInfo) -> list[str]:
        return problems(engine, host)

    def kv_layout(self, graph: GraphInfo, engine: EngineInfo) -> KVLayout:
        options = CompileOptions.parse(engine.session_options)
        return kv_layout(graph, options.kv_precision(graph.kv_dtype))

    def resident_memory(self, engine: EngineInfo, shape: ServingShape) -> ResidentMemory:
        return RESIDENT.estimate(shape)

    def open(
        self, path: Path, engine: EngineInfo, pool: KVPool, settings: SessionSettings
    ) -> OpenVinoSession:
        options = CompileOptions.parse(engine.session_options)
        precision = _PRECISION_OF.get(pool.dtype.name)
        if precision is None:
            raise SessionError(f"a pool of {pool.dtype} is not an OpenVINO cache (layout.py)")
        # Imported here: the session's modules import openvino, and selection imports every
        # kind's plug-in to ask `problems` -- a host without openvino (the base install) must
        # get "openvino is not installed" from it, not an ImportError.
        from ingot.runtime.engines.openvino.load import open_session

        return open_session(path, options, precision, pool, settings)


PLUGIN = OpenVinoEngine()
