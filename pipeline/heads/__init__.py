"""Medusa heads for speculative decoding: attached (vLLM's layout) or trained against the
quantized target, exported to ONNX and checked (speculative.method: medusa)."""

from .attach import AttachedHeads, resolve_heads
from .export import check_heads, export_heads
from .train import final_hidden, train_heads

__all__ = [
    "AttachedHeads",
    "check_heads",
    "export_heads",
    "final_hidden",
    "resolve_heads",
    "train_heads",
]
