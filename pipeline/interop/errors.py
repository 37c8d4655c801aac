"""The error every interop writer raises for a model its format cannot hold."""

from ingot.common.errors import IngotError

__all__ = ["InteropError"]


class InteropError(IngotError, ValueError):
    """The quantized model cannot be written in the requested on-disk format."""
