"""The recipe's ``targets`` entry of the ONNX Runtime engine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import EngineTarget

__all__ = ["OnnxRuntimeTarget"]


class OnnxRuntimeTarget(EngineTarget):
    """ONNX Runtime; the graph is optimized at build time and loaded as is by the runtime."""

    engine: Literal["onnxruntime"] = Field(description="Inference engine.")
    device: Literal["cpu"] = Field(default="cpu", description="Execution provider's device.")
    optimization_level: Literal["basic", "extended", "all"] = Field(
        default="extended",
        description=(
            "ORT graph optimization level applied at build time. 'extended' fuses attention, "
            "norms and int4/int8 DequantizeLinear+MatMul into MatMulNBits and stays portable; "
            "'all' adds layout transforms tied to the build host's CPU ISA, which the manifest "
            "then requires of every host."
        ),
    )
    intra_op_num_threads: int = Field(
        default=0, ge=0, description="Threads per operator; 0 lets ONNX Runtime choose."
    )
    matmul_accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        default=4,
        description=(
            "Compute type of ORT's fused MatMulNBits: 4 (the default) quantizes activations to "
            "int8 inside the kernel: faster (much faster for int8 weights on CPU), not the "
            "graph's exact numbers; the build checks the same graph at level 0 exactly against "
            "the IR and the engine itself loosely, and `evaluate` measures the engine's "
            "perplexity. 0 keeps fp32 activations (the exported graph's numbers, checked "
            "exactly)."
        ),
    )
