"""The OpenVINO CPU engine's build half: its recipe target (target.py) and recipe checks
(checks.py: KV blocks of 32, no fp8 cache, no W8A8 / FP8 / asymmetric weights), its record
(record.py: no file of its own, the portable graph's weights are read at load), the runtime
half's session as the IR check runs it (graph.py) and the `EngineBuilder` over them
(builder.py). The model itself is built at load by the runtime half
(ingot.runtime.engines.openvino): a graph with PagedAttention cannot be saved.

Imports the builder interface (pipeline/engines/base.py), the quantize methods' registry
(checks.py), the runtime's batch, pool and engine plug-ins, numpy, pydantic and openvino.
"""

from .builder import OpenVinoBuilder
from .checks import CPU_BLOCK_SIZE
from .graph import OpenVinoGraph
from .record import KV_PRECISION, openvino_record
from .target import OpenVinoTarget

__all__ = [
    "CPU_BLOCK_SIZE",
    "KV_PRECISION",
    "PLUGIN",
    "OpenVinoBuilder",
    "OpenVinoGraph",
    "OpenVinoTarget",
    "openvino_record",
]

PLUGIN = OpenVinoBuilder()
