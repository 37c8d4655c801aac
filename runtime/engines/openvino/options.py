"""An OpenVINO engine's record (``session_options``) as the CPU plugin's compile properties.

The build half (pipeline/engines/openvino) writes exactly these keys; a missing key takes the
value that computes exactly (f32, no activation quantization), an unknown one is refused:

    inference_precision              "f32" | "bf16"   the activations' (INFERENCE_PRECISION_HINT)
    kv_cache_precision               "f32" | "f16" | "u8"   the caches' (KV_CACHE_PRECISION);
                                     must be the graph's kv_dtype's (`KV_PRECISIONS`); f32 and
                                     f16 need inference_precision f32
    dynamic_quantization_group_size  0 | 32   int8 activations in groups of this many (0: off)
                                     in the int4 / int8 matmuls
    num_threads                      0 = OpenVINO's default (every core), else that many
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingot.runtime.engines.base import SessionError

__all__ = ["KV_PRECISIONS", "CompileOptions"]

# graph.kv_dtype -> the cache precision OpenVINO keeps it in: fp32 / fp16 as they are, int8 as
# the plugin's own u8 form (scale and zero point per block, computed as it writes: not the
# graph's calibrated per-head scales, which the op has no input for). fp8 has no counterpart.
KV_PRECISIONS = {"fp32": "f32", "fp16": "f16", "int8": "u8"}
_INFERENCE_PRECISIONS = ("f32", "bf16")


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """A record's session options, checked (`parse`)."""

    inference_precision: str = "f32"
    kv_cache_precision: str | None = None  # None: the graph's kv_dtype's
    dynamic_quantization_group_size: int = 0
    num_threads: int = 0

    @classmethod
    def parse(cls, recorded: dict[str, Any]) -> CompileOptions:
        """The record's ``session_options``, or SessionError naming the key at fault."""
        unknown = sorted(set(recorded) - set(cls.__dataclass_fields__))
        if unknown:
            raise SessionError(f"session_options: unknown keys {unknown}")
        options = cls(**recorded)
        if options.inference_precision not in _INFERENCE_PRECISIONS:
            raise SessionError(
                f"session_options.inference_precision {options.inference_precision!r} not in "
                f"{', '.join(_INFERENCE_PRECISIONS)}"
            )
        kv = options.kv_cache_precision
        if kv is not None and kv not in KV_PRECISIONS.values():
            allowed = ", ".join(KV_PRECISIONS.values())
            raise SessionError(f"session_options.kv_cache_precision {kv!r} not in {allowed}")
        if kv in ("f32", "f16") and options.inference_precision != "f32":
            # With bf16 activations the plugin keeps a float cache in bf16 whatever was asked
            # (f32: "expect kvcache type bf16"; f16: a bf16 cache), which the pool cannot hold.
            raise SessionError(
                f"session_options.kv_cache_precision {kv} needs inference_precision f32 (with "
                f"{options.inference_precision} activations a float cache is kept in "
                f"{options.inference_precision}; u8 works with either)"
            )
        for key in ("dynamic_quantization_group_size", "num_threads"):
            value = getattr(options, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SessionError(f"session_options.{key} {value!r}: a non-negative integer")
        return options

    def kv_precision(self, kv_dtype: str) -> str:
        """The cache precision of a graph whose pool holds `kv_dtype`, or SessionError."""
        if kv_dtype not in KV_PRECISIONS:
            raise SessionError(
                f"graph.kv_dtype {kv_dtype}: OpenVINO's PagedAttention keeps f32, f16 or its own "
                "u8 caches (kv_cache.dtype fp32, fp16 or int8), no fp8 form"
            )
        wanted = KV_PRECISIONS[kv_dtype]
        if self.kv_cache_precision not in (None, wanted):
            raise SessionError(
                f"session_options.kv_cache_precision {self.kv_cache_precision} does not hold "
                f"the graph's kv_dtype {kv_dtype} (expected {wanted})"
            )
        return wanted

    def properties(self, kv_precision: str, threads: int | None = None) -> dict[str, Any]:
        """The CPU plugin's compile properties; `threads` overrides num_threads (a draft's)."""
        properties: dict[str, Any] = {
            "NUM_STREAMS": 1,  # one request at a time: the Generator's calls
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": self.inference_precision,
            "KV_CACHE_PRECISION": kv_precision,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": self.dynamic_quantization_group_size,
        }
        threads = self.num_threads if threads is None else threads
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        return properties
