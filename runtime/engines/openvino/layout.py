"""The KV pool an OpenVINO engine reads: the CPU plugin's cache blocks, in the pool's arrays.

The plugin's PagedAttention runs 32-token blocks only, head-major within a block: an f32 / f16
block is [Hkv, 32, D]. Its u8 form keeps each block's scales and zero points inside the block,
computed as it writes (KEY_CACHE_GROUP_SIZE / VALUE_CACHE_GROUP_SIZE 0: one group per head):
keys are quantized per channel, two f32 rows (scale, zero point) after the block's 32 token rows,
[Hkv, 32 + 8, D] bytes; values per token, two f32 after each token's D codes, [Hkv, 32, D + 8].
The pool allocates exactly these arrays (`KVLayout.block_shapes`), the session hands OpenVINO
the same memory, and the op reads and writes it in place; the session checks that the compiled
model's cache inputs have these shapes.
"""

from __future__ import annotations

import numpy as np

from ingot.artifacts import GraphInfo
from ingot.runtime.engines.base import SessionError
from ingot.runtime.kv_pool import KVLayout

__all__ = ["CPU_BLOCK_SIZE", "CACHE_DTYPES", "kv_layout"]

CPU_BLOCK_SIZE = 32  # the CPU plugin's; a recipe with an openvino target must use it
# A cache precision -> the numpy dtype of the pool arrays that hold it.
CACHE_DTYPES = {"f32": np.float32, "f16": np.float16, "u8": np.uint8}
_SCALE_ZERO_BYTES = 8  # one f32 scale and one f32 zero point


def kv_layout(graph: GraphInfo, precision: str) -> KVLayout:
    """The pool for `graph`'s interface with caches of `precision` (options.KV_PRECISIONS)."""
    if graph.kv_block_size != CPU_BLOCK_SIZE:
        raise SessionError(
            f"graph.kv_block_size {graph.kv_block_size}: OpenVINO's CPU PagedAttention runs "
            f"blocks of {CPU_BLOCK_SIZE} tokens (kv_cache.block_size: {CPU_BLOCK_SIZE})"
        )
    hkv, d, b = graph.num_kv_heads, graph.head_dim, CPU_BLOCK_SIZE
    if precision == "u8":
        shapes = ((hkv, b + _SCALE_ZERO_BYTES, d), (hkv, b, d + _SCALE_ZERO_BYTES))
    else:
        shapes = ((hkv, b, d), (hkv, b, d))
    dtype = np.dtype(CACHE_DTYPES[precision])
    return KVLayout(graph.num_layers, b, hkv, d, dtype, block_shapes=shapes)
