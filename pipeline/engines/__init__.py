"""Engine builders: one package per engine, found by the recipe's ``targets[].engine``.

`ENGINE_BUILDERS` maps an engine's name to its package, whose ``PLUGIN`` implements
`base.EngineBuilder`; other distributions add engines under the ``ingot.engine_builders``
entry-point group. The runtime half of an engine registers in `ingot.runtime.engines`.
Imports only the registry and the interface: a plug-in is imported when first asked for.
"""

from __future__ import annotations

from ingot.common import Registry

from .base import EngineBuilder

__all__ = ["ENGINE_BUILDERS"]

ENGINE_BUILDERS: Registry[EngineBuilder] = Registry(
    "engine",
    {
        "onnxruntime": "ingot.pipeline.engines.onnxruntime",
        "openvino": "ingot.pipeline.engines.openvino",
    },
    group="ingot.engine_builders",
)
