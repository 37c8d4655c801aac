"""The recipe's ``targets`` entry of the OpenVINO engine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import EngineTarget

__all__ = ["OpenVinoTarget"]


class OpenVinoTarget(EngineTarget):
    """OpenVINO's CPU plugin: the model is built at load from the artifact's portable graph
    (its weights as exported, no copy) around OpenVINO's PagedAttention, which reads and
    writes the KV pool in place."""

    engine: Literal["openvino"] = Field(description="Inference engine.")
    device: Literal["cpu"] = Field(default="cpu", description="OpenVINO device plugin.")
    inference_precision: Literal["f32", "bf16"] = Field(
        default="f32",
        description=(
            "Activations' precision (OpenVINO's INFERENCE_PRECISION_HINT). 'f32' (the "
            "default): the exported graph's arithmetic, checked exactly when "
            "dynamic_quantization is off; on the demo as fast as bf16 or faster. 'bf16' (the "
            "plugin's own default on CPUs with bf16 instructions; elsewhere it computes in "
            "f32): keeps a float KV cache in bf16, so it needs kv_cache.dtype int8 (the "
            "plugin's u8 form); "
            "not exact: the build checks the same model at f32 exactly against the IR first, "
            "then the engine loosely."
        ),
    )
    dynamic_quantization: bool = Field(
        default=True,
        description=(
            "Quantize the activations of the int4 / int8 weight matmuls to int8 on the fly, in "
            "groups of 32 (OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE): on by default, 1.2-2x "
            "faster decoding on the demo; not exact, so checked as bf16 is (an exact f32 "
            "check first, the engine loosely). false keeps them in inference_precision."
        ),
    )
    num_threads: int = Field(
        default=0, ge=0, description="Inference threads; 0 lets OpenVINO choose (all cores)."
    )
