"""The ONNX Runtime CPU engine's build half: its recipe target (target.py), the graph optimized
once and serialized with its record (build.py; FP8 weights folded first, fp8_weights.py), the
sessions the build checks (session.py) and the `EngineBuilder` over them (builder.py).
`check_export` (check.py: a graph against the IR on an ORT session) is imported from its
module: it needs torch, which the recipe must not import through this package.

Imports the builder interface (pipeline/engines/base.py), pipeline.export and pipeline.model
(check.py), the runtime half's session options (ingot.runtime.engines.onnxruntime), numpy,
pydantic and onnxruntime; onnx only when an engine is built or described.
"""

from .build import DATA_FILE, ENGINE_NAME, MODEL_FILE, build_onnxruntime_engine, host_cpu_isa
from .builder import OnnxRuntimeBuilder
from .session import OrtGraph, load_onnxruntime_engine, ort_optimization_level, session_options
from .target import OnnxRuntimeTarget

__all__ = [
    "DATA_FILE",
    "ENGINE_NAME",
    "MODEL_FILE",
    "PLUGIN",
    "OnnxRuntimeTarget",
    "OrtGraph",
    "build_onnxruntime_engine",
    "host_cpu_isa",
    "load_onnxruntime_engine",
    "ort_optimization_level",
    "session_options",
]

PLUGIN = OnnxRuntimeBuilder()
