"""Medusa heads for speculative decoding: attached (vLLM's layout) or trained against the
quantized target, exported to ONNX and checked (speculative.method: medusa); the EAGLE-3
draft's training (speculative.method: eagle).

Imports pipeline.model (the heads' and the draft's torch models), pipeline.export (the ONNX
building blocks), pipeline.recipe, the stage cache's digests (pipeline/cache.py), the runtime's
batch and KV pool (the exported draft is checked through them), torch, onnx and onnxruntime.
"""

from .attach import AttachedHeads, resolve_heads
from .eagle_train import target_features, train_eagle
from .export import check_heads, export_heads
from .train import final_hidden, train_heads

__all__ = [
    "AttachedHeads",
    "check_heads",
    "export_heads",
    "final_hidden",
    "resolve_heads",
    "target_features",
    "train_eagle",
    "train_heads",
]
