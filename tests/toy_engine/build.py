"""The toy engine's build half: the exported graph copied as the engine, run unoptimized (its
own numbers: checked exactly)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ingot.pipeline.engines.base import (
    EngineEstimate,
    EngineSizing,
    EngineTarget,
    ExactRun,
    engine_name,
)
from ingot.pipeline.engines.onnxruntime import OrtGraph, load_onnxruntime_engine

FILES = ("model.onnx", "model.onnx.data")


class ToyTarget(EngineTarget):
    """The toy engine: the exported graph as it is, run by ONNX Runtime unoptimized."""

    engine: Literal["toy"] = Field(description="Inference engine.")
    device: Literal["cpu"] = Field(default="cpu", description="Where it runs.")


class ToyBuilder:
    name = "toy"
    target_model = ToyTarget
    constants = {"toy_bytes_per_second": 1e9}  # a copy

    def recipe_problems(self, target: ToyTarget, recipe: Any) -> list[str]:
        return []  # it runs whatever exports

    def model_problems(self, target: ToyTarget, cfg: Any, where: str) -> list[str]:
        return []

    def accuracy(self, target: ToyTarget) -> Literal["exact"]:
        return "exact"  # the graph's own numbers, fp32 activations

    def own_kv(self, kv_dtype: str) -> bool:
        return False  # its pools are the graph's

    def exact(
        self, graph: Path, target: ToyTarget, *, sliding_window: int | None = None
    ) -> ExactRun | None:
        return None  # the engine's own check is exact

    def build(self, graph: Path, target: ToyTarget, out: Path) -> dict[str, Any]:
        for name in FILES:
            shutil.copyfile(graph.parent / name, out / name)
        name = engine_name(target)
        return {
            "name": name,
            "engine": "toy",
            "device": "cpu",
            "path": f"engines/{name}/{FILES[0]}",
            "requires": {},
            "session_options": {"graph_optimization_level": "disable_all"},
            "build": {"copied": list(FILES)},
        }

    def open(
        self,
        graph: Path,
        out: Path,
        record: dict[str, Any],
        *,
        sliding_window: int | None = None,  # the graph's mask applies it
    ) -> OrtGraph:
        path = out / Path(record["path"]).name
        return OrtGraph(load_onnxruntime_engine(path, record["session_options"]))

    def estimate(self, target: ToyTarget, sizing: EngineSizing) -> EngineEstimate:
        seconds = sizing.graph_bytes / self.constants["toy_bytes_per_second"]
        peak = sizing.baseline_bytes + sizing.graph_bytes
        return EngineEstimate(peak, seconds, sizing.graph_bytes, "a copy of the graph")

    def describe(self, record: dict[str, Any], engine_dir: Path) -> str:
        return "the exported graph, unoptimized"


PLUGIN = ToyBuilder()
