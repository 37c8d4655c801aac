"""The `kv_cache` and `export` sections: the paged KV cache layout and the ONNX graph.

Both go into the export stage: the exported graph reads the KV cache by block table.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Strict

__all__ = ["QUANTIZED_KV_DTYPES", "Export", "KvCache"]


# KV dtypes stored as 8-bit codes with calibrated per-head scales (pipeline/model/kv_quant.py)
QUANTIZED_KV_DTYPES = ("int8", "fp8")


class KvCache(_Strict):
    """The paged KV cache the runtime allocates; the exported graph reads it by block table."""

    dtype: Literal["fp32", "fp16", "int8", "fp8"] = Field(
        default="fp32",
        description="Element type of K/V in the pool. int8 and fp8 (E4M3FN) store 8-bit codes "
        "with symmetric per-layer, per-head K and V scales calibrated on the `calibration` "
        "windows (required): half the bytes of fp16.",
    )
    block_size: Literal[1, 2, 4, 8, 16, 32, 64, 128, 256] = Field(
        default=16, description="Tokens per KV block (a power of two, 1..256)."
    )

    @property
    def quantized(self) -> bool:
        """K/V are stored as codes whose scales are calibrated (int8, fp8)."""
        return self.dtype in QUANTIZED_KV_DTYPES


class Export(_Strict):
    """The ONNX graph: standard operators, fused attention."""

    opset: Literal[23] = Field(default=23, description="ONNX opset (23: fused `Attention`).")
    max_seq_len: int = Field(
        default=2048, ge=16, description="Longest sequence (prompt + output) the artifact serves."
    )
    fused_attention: Literal[True] = Field(
        default=True, description="Export attention as the op-23 `Attention` operator."
    )
    dtype: Literal["fp32"] = Field(
        default="fp32", description="Element type of activations and unquantized weights."
    )
