"""Engine runtimes: one package per engine kind, found by the manifest's ``engines[].engine``.

`ENGINE_RUNTIMES` maps a kind to its package, whose ``PLUGIN`` implements
`base.EngineRuntime`; other distributions add kinds under the ``ingot.engine_runtimes``
entry-point group. The build half of an engine registers in `ingot.pipeline.engines`. Imports
only the registry and the interface: a plug-in is imported when first asked for. Like the rest
of the runtime, no plug-in may import torch, transformers, onnx or the build packages.
"""

from __future__ import annotations

from ingot.common import Registry
from ingot.runtime.engines.base import EngineRuntime

__all__ = ["ENGINE_RUNTIMES"]

ENGINE_RUNTIMES: Registry[EngineRuntime] = Registry(
    "engine",
    {
        "onnxruntime": "ingot.runtime.engines.onnxruntime",
        "openvino": "ingot.runtime.engines.openvino",
    },
    group="ingot.engine_runtimes",
)
