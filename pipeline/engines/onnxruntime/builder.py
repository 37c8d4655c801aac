"""The ONNX Runtime CPU engine as an `EngineBuilder`: build, open, exact variant, plan
estimate and report label."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ..base import Accuracy, EngineEstimate, EngineSizing, ExactRun
from .build import build_onnxruntime_engine
from .session import OrtGraph, load_onnxruntime_engine, ort_optimization_level, session_options
from .target import OnnxRuntimeTarget

__all__ = ["ESTIMATES", "OnnxRuntimeBuilder"]

# `ingot plan`'s constants for this engine, chosen like plan.py's on the reference machine.
ESTIMATES = {
    "engine_bytes_per_second": 100e6,  # ORT optimizing + saving + reloading, per exported byte
    # At matmul_accuracy_level 4 the graph is first optimized in memory at level 0 and checked
    # exactly; the engine's check reuses that check's IR reference, so only the extra session
    # costs (1B shape, RTN g128: 14.4-16.8 s at level 4 against 16.0 s at level 0, one run each).
    "exact_check_factor": 0.1,
    # Engine stage: ORT holds the exported weights once; a tied embedding is also prepacked
    # for the lm_head's Gemm, beside the Gather's copy.
    "engine_resident_factor": 1.0,
    "tied_embedding_factor": 2.0,
}


# ORT's kernels of W8A8 linears (export/input_quant.py's forms, as ORT fuses them).
_INTEGER_MATMULS = {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}


def _session_with_qmoe(graph: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    """A session over ``graph`` with its mixture-of-experts blocks fused into QMoE at accuracy
    level 0, as `build` fuses them (qmoe.py): the exact variant of the built engine."""
    from .qmoe import fuse_experts  # imports onnx: build-only, as in `describe`

    with tempfile.TemporaryDirectory() as fused_dir:
        fused = fuse_experts(graph, Path(fused_dir), accuracy_level=0)
        source = Path(fused_dir) / "model.onnx" if fused else graph
        # The session holds its weights once created: the folder can go.
        return ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


class OnnxRuntimeBuilder:
    """`EngineBuilder` for ``targets[].engine: onnxruntime`` (see build.py for the engine)."""

    name = "onnxruntime"
    target_model = OnnxRuntimeTarget
    constants = ESTIMATES

    def recipe_problems(self, target: OnnxRuntimeTarget, recipe: Any) -> list[str]:
        return []  # the exported graph is ONNX Runtime's: it runs whatever exports

    def model_problems(self, target: OnnxRuntimeTarget, cfg: Any, where: str) -> list[str]:
        return []  # as above; mixtures of experts run as QMoE or the standard block (qmoe.py)

    def accuracy(self, target: OnnxRuntimeTarget) -> Accuracy:
        """Int8 activations at MatMulNBits accuracy level 4, else exact (fp32)."""
        return "int8_activations" if target.matmul_accuracy_level == 4 else "exact"

    def own_kv(self, kv_dtype: str) -> bool:
        return False  # the engine's pools are the exported graph's inputs

    def exact(
        self, graph: Path, target: OnnxRuntimeTarget, *, sliding_window: int | None = None
    ) -> ExactRun | None:
        """The exported graph optimized in memory as the target optimizes it, but with
        MatMulNBits at accuracy level 0 (fp32 activations); nothing is written."""
        if self.accuracy(target) == "exact":
            return None  # the engine's own check is exact
        options = session_options("exact")  # session.qdq_matmulnbits_accuracy_level = "0"
        options.graph_optimization_level = ort_optimization_level(target.optimization_level)
        options.intra_op_num_threads = target.intra_op_num_threads
        options.log_severity_level = 3  # level "all" warns that its graph is host specific
        session = _session_with_qmoe(graph, options)
        level = target.matmul_accuracy_level
        what = (
            f"the graph at MatMulNBits accuracy level 0, before the level-{level} engine is built"
        )
        return ExactRun(OrtGraph(session), what)

    def build(self, graph: Path, target: OnnxRuntimeTarget, out: Path) -> dict[str, Any]:
        return build_onnxruntime_engine(
            graph,
            out,
            optimization_level=target.optimization_level,
            intra_op_num_threads=target.intra_op_num_threads,
            matmul_accuracy_level=target.matmul_accuracy_level,
        )

    def open(
        self,
        graph: Path,
        out: Path,
        record: dict[str, Any],
        *,
        sliding_window: int | None = None,  # the graph's mask applies it
    ) -> OrtGraph:
        engine_file = out / Path(record["path"]).name
        return OrtGraph(load_onnxruntime_engine(engine_file, record["session_options"]))

    def estimate(self, target: OnnxRuntimeTarget, sizing: EngineSizing) -> EngineEstimate:
        # ORT loads the exported weights once to optimize and save the engine, then the saved
        # engine once to check it against the IR (one layer at a time); a tied embedding is
        # also prepacked for the lm_head's Gemm. At accuracy level 4 an exact check of the
        # graph optimized in memory at level 0 comes first, its session released before the next.
        c = ESTIMATES
        resident = c["engine_resident_factor"] * sizing.graph_bytes
        resident += c["tied_embedding_factor"] * sizing.tied_embedding_bytes
        seconds = sizing.graph_bytes / c["engine_bytes_per_second"]
        note = "ORT holds the exported weights once (the check reuses them)"
        if self.accuracy(target) != "exact":
            seconds *= 1 + c["exact_check_factor"]
            note += "; int8 activations: an exact check at level 0 first"
        peak = int(sizing.baseline_bytes + resident)
        return EngineEstimate(peak, seconds, sizing.graph_bytes, note)  # files ~ the graph's

    def describe(self, record: dict[str, Any], engine_dir: Path) -> str:
        """The accuracy level of its MatMulNBits where the engine has any (ORT fuses int4 /
        int8 weight-only linears into them); else its integer MatMuls (W8A8); else what its
        fp32 MatMuls compute on (FP8 weights are folded to fp32 at build: fp8_weights.py)."""
        import onnx  # build-only: a recipe that names this engine loads this module without it

        engine_file = engine_dir / Path(record["path"]).name
        graph = onnx.load(str(engine_file), load_external_data=False).graph
        ops = {node.op_type for node in graph.node}
        experts = ", experts in QMoE" if "QMoE" in ops else ""  # qmoe.py
        if "MatMulNBits" in ops:
            level = record["build"]["matmul_accuracy_level"]
            activations = "int8" if level == 4 else "fp32"
            return f"MatMulNBits accuracy level {level}, {activations} activations{experts}"
        if ops & _INTEGER_MATMULS:
            return "no MatMulNBits: integer MatMul, int8 weights and activations"
        if record["build"].get("fp8_weights_dequantized"):
            return "no MatMulNBits: fp32 MatMul, FP8 weights dequantized to fp32 at build"
        return "no MatMulNBits: fp32 MatMul"
