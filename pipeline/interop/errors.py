"""The error every interop writer raises for a model its format cannot hold."""

__all__ = ["InteropError"]


class InteropError(ValueError):
    """The quantized model cannot be written in the requested on-disk format."""
