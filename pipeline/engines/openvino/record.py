"""The OpenVINO engine's record (the manifest's engine entry): what a host needs, what the
runtime half applies when it builds and compiles the model at load, how it was built.

The engine adds no file to the artifact: its ``path`` is the portable graph's (``model.onnx``),
whose weights the runtime half reads with OpenVINO's ONNX frontend and rebuilds around
PagedAttention (runtime/engines/openvino); the package step points it at the onnxruntime
engine's graph instead where the artifact ships one (the artifact's one copy of the weights:
pipeline/manifest_fields.py). A graph with PagedAttention cannot be saved as an
OpenVINO IR ("unsupported opset: extension"), so nothing compiled is shipped either: the CPU
plugin compiles on the serving host, choosing its kernels for that host's instruction set,
which is why the record names no ``cpu_isa``.
"""

from __future__ import annotations

from typing import Any

from ..base import engine_name
from .target import OpenVinoTarget

__all__ = [
    "DYNAMIC_QUANTIZATION_GROUP",
    "KV_PRECISION",
    "openvino_record",
    "openvino_requires",
    "session_options",
]

# The recipe's kv_cache.dtype -> the CPU plugin's KV_CACHE_PRECISION (fp8: refused, checks.py).
KV_PRECISION = {"fp32": "f32", "fp16": "f16", "int8": "u8"}
# DYNAMIC_QUANTIZATION_GROUP_SIZE when dynamic_quantization is on: OpenVINO's own default,
# one int8 scale per 32 activations (the spike measured its speed with it).
DYNAMIC_QUANTIZATION_GROUP = 32


def openvino_version() -> str:
    """The installed openvino's release ("2026.4.1")."""
    # Optional (the `openvino` extra): loaded when an engine is built, not when a recipe
    # names this engine's target.
    import openvino as ov

    return ov.__version__.split("-")[0]


def openvino_requires(version: str) -> str:
    """The openvino versions that can build the model the engine of ``version`` was checked
    with: its minor only (PagedAttention is experimental in Python, "no backward
    compatibility")."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def openvino_record(target: OpenVinoTarget, graph_name: str, kv_dtype: str) -> dict[str, Any]:
    """The record of ``target`` built from the graph named ``graph_name`` (model.onnx) whose
    KV cache is ``kv_dtype``."""
    version = openvino_version()
    return {
        "name": engine_name(target),
        "engine": "openvino",
        "device": target.device,
        "path": graph_name,  # the portable graph: its weights are the engine's
        "requires": {"openvino": openvino_requires(version)},
        "session_options": session_options(target, kv_dtype),
        # Read from the file the manifest's entry names: the onnxruntime engine's graph where
        # the artifact ships one (its initializers, renamed), else the portable graph.
        "build": {"openvino": version, "weights": "the exported graph's initializers"},
    }


def session_options(
    target: OpenVinoTarget, kv_dtype: str, *, exact: bool = False
) -> dict[str, Any]:
    """What the runtime compiles with; ``exact``: the exact variant (f32 activations, none
    quantized, an fp32 cache where the engine's own would be u8)."""
    kv = KV_PRECISION[kv_dtype]
    dynamic = target.dynamic_quantization and not exact
    return {
        "inference_precision": "f32" if exact else target.inference_precision,
        "kv_cache_precision": "f32" if exact and kv == "u8" else kv,
        "dynamic_quantization_group_size": DYNAMIC_QUANTIZATION_GROUP if dynamic else 0,
        "num_threads": target.num_threads,
    }
