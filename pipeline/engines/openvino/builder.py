"""The OpenVINO CPU engine as an `EngineBuilder`: recipe checks, the record (nothing else is
written), the runtime's session as the check runs it, its exact variant, the plan's estimate
and the report's label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base import Accuracy, EngineEstimate, EngineSizing, ExactRun, engine_name
from .checks import model_problems, recipe_problems
from .graph import OpenVinoGraph, graph_interface
from .record import openvino_record, session_options
from .target import OpenVinoTarget

__all__ = ["ESTIMATES", "OpenVinoBuilder"]

# `ingot plan`'s constants for this engine. The stage writes nothing: its time is the check's
# compiles (the exact variant's and the engine's), each a load as the runtime's: the graph's
# weights read by the ONNX frontend, the decoder rebuilt around them, the CPU plugin's compile.
# Measured: the 1B shape (a ~1.8 GB int4 g32 graph) loads in 9.6-11.1 s in the spike
# (benchmarks/results/spike_openvino.json, `load_s`), ~170 MB/s; the demo (7.4 MB) builds its
# stage in 1.8 s, two loads and checks of ~0.3 s each plus the check's IR side. Peak RSS of a
# 1B load was 2.4-2.6 GiB with its KV pool: ~1.3x the graph.
ESTIMATES = {
    "openvino_bytes_per_second": 170e6,
    "openvino_seconds_per_compile": 0.3,
    "openvino_resident_factor": 1.5,
}


class OpenVinoBuilder:
    """`EngineBuilder` for ``targets[].engine: openvino`` (record.py: the engine)."""

    name = "openvino"
    target_model = OpenVinoTarget
    constants = ESTIMATES

    def recipe_problems(self, target: OpenVinoTarget, recipe: Any) -> list[str]:
        where = f"targets.{list(recipe.targets).index(target)}"
        return recipe_problems(recipe, target, where)

    def model_problems(self, target: OpenVinoTarget, cfg: Any, where: str) -> list[str]:
        return model_problems(cfg, where)

    def accuracy(self, target: OpenVinoTarget) -> Accuracy:
        """bf16 activations or int8 dynamic quantization: loose; f32 without: exact."""
        exact = target.inference_precision == "f32" and not target.dynamic_quantization
        return "exact" if exact else "int8_activations"

    def own_kv(self, kv_dtype: str) -> bool:
        return kv_dtype == "int8"  # the plugin's u8 blocks, not the graph's codes

    def exact(
        self, graph: Path, target: OpenVinoTarget, *, sliding_window: int | None = None
    ) -> ExactRun | None:
        """The same model compiled with f32 activations, no dynamic quantization and an fp32
        cache where the engine's is u8; nothing is written."""
        kv_dtype = graph_interface(graph).kv_dtype
        if self.accuracy(target) == "exact" and not self.own_kv(kv_dtype):
            return None  # the engine's own check is exact
        record = openvino_record(target, graph.name, kv_dtype)
        record["session_options"] = session_options(target, kv_dtype, exact=True)
        what = f"{engine_name(target)} at f32, no dynamic quantization, an f32 KV cache"
        return ExactRun(OpenVinoGraph(graph, record, sliding_window), what)

    def build(self, graph: Path, target: OpenVinoTarget, out: Path) -> dict[str, Any]:
        out.mkdir(parents=True, exist_ok=True)  # no file: the engine is the graph's weights
        return openvino_record(target, graph.name, graph_interface(graph).kv_dtype)

    def open(
        self,
        graph: Path,
        out: Path,
        record: dict[str, Any],
        *,
        sliding_window: int | None = None,
    ) -> OpenVinoGraph:
        return OpenVinoGraph(graph, record, sliding_window)

    def estimate(self, target: OpenVinoTarget, sizing: EngineSizing) -> EngineEstimate:
        c = ESTIMATES
        compiles = 1 if self.accuracy(target) == "exact" else 2  # + the exact variant
        per_compile = sizing.graph_bytes / c["openvino_bytes_per_second"]
        seconds = compiles * (c["openvino_seconds_per_compile"] + per_compile)
        resident = c["openvino_resident_factor"] * sizing.graph_bytes
        peak = int(sizing.baseline_bytes + resident)
        note = "no engine file (the graph's weights, compiled at load)"
        if compiles == 2:
            note += "; not exact: an f32 compile is checked exactly first"
        return EngineEstimate(peak, seconds, 0, note)

    def describe(self, record: dict[str, Any], engine_dir: Path) -> str:
        """e.g. "bf16 activations, int8 dynamic quantization (groups of 32), u8 KV"."""
        o = record["session_options"]
        group = o["dynamic_quantization_group_size"]
        dynamic = f"int8 dynamic quantization (groups of {group})" if group else "no dynamic "
        dynamic += "" if group else "quantization"
        return f"{o['inference_precision']} activations, {dynamic}, {o['kv_cache_precision']} KV"
