"""What every layer of ingot shares: the root of its user errors and the plug-in registry.

Imports only the standard library: `artifacts`, `runtime`, `calibration`, `pipeline` and the
`ingot` CLI all build on it (the layering: common <- artifacts <- runtime <- calibration <-
pipeline <- ingot).
"""

from ingot.common.errors import IngotError
from ingot.common.registry import Registry, UnknownPlugin

__all__ = ["IngotError", "Registry", "UnknownPlugin"]
