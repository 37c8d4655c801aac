"""Stage: export the IR to ONNX, one decoder layer at a time.

The IR is read through `IRLayers` (one layer in memory at a time) and each layer's weights
stream into ``model.onnx.data`` as the graph is built. The graph is checked against the IR by
the engine stage, on the session that builds the engine (`stages/engine.py`), so the weights
are loaded into ONNX Runtime once and the check covers the engine that ships.

An int8 / fp8 KV cache first calibrates its per-head K/V scales on the calibrate stage's
windows (`quantize/kv_scales.py`, on the IR layer by layer, on the calibrate stage's device);
they go into the graph and into ``graph.json`` (``kv_scales``: the manifest's), where the
engine stage reads them back to check the engine against the IR rounding its K/V the same way.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.artifacts import GraphInfo
from ingot.calibration.dataset import CalibrationSet

from ..export import MODEL_FILE, export_onnx
from ..model.kv_quant import KVQuantLayers, KVScales
from ..model.layer_source import LayerSource
from ..quantize.ir_layers import IRLayers
from ..quantize.kv_scales import calibrate_kv_scales
from ..recipe import Recipe
from ..recipe.export import Export, KvCache
from .calibrate import Calibrated, read_device_settings
from .quantize import QuantizeOutput
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["ExportOutput", "export_stage", "rounding_as_exported", "run_export"]

_KV_WORK = ".kv-calibration"  # a dot-name: never part of the output's digest


@dataclass(frozen=True, slots=True)
class ExportOutput(StageOutput):
    """``model.onnx`` + ``model.onnx.data`` (the portable graph the artifact ships) and
    ``graph.json`` (its interface: the manifest's `graph`, with `kv_scales` for an int8 / fp8
    KV cache)."""

    GRAPH: ClassVar[str] = MODEL_FILE
    GRAPH_INFO: ClassVar[str] = "graph.json"

    def graph_info(self) -> dict[str, Any]:
        """graph.json, as the manifest records it."""
        return self._json(self.GRAPH_INFO)

    def interface(self) -> GraphInfo:
        """graph.json as the runtime opens an engine built from this graph."""
        return GraphInfo.model_validate(self.graph_info())

    def kv_scales(self) -> KVScales | None:
        """The calibrated K/V scales (graph.json `kv_scales`), None without them."""
        return _kv_scales(self.dir)


def export_stage(
    prefix: str,
    recipe: Recipe,
    quantize: Stage[QuantizeOutput],
    calibrated: Calibrated | None,
    aux_layers: tuple[int, ...] | None = None,
) -> Stage[ExportOutput]:
    """The export stage of one model (`prefix` "" or "draft-"): keyed on the recipe's `export`
    and `kv_cache` and the IR; an int8 / fp8 KV cache's scales are calibrated on the windows
    here, so they key it too; `aux_layers` (an EAGLE-3 draft's inputs) only when given, so
    other recipes keep their keys."""
    key_slice = recipe.stage_slice("export")
    inputs: dict[str, Input] = {"quantize": quantize}
    calibrate = None
    if recipe.kv_cache.quantized:
        if calibrated is None:
            raise ValueError(f"{prefix}export: kv_cache {recipe.kv_cache.dtype} needs windows")
        calibrate = calibrated.stage
        key_slice = {**key_slice, "calibration": calibrated.key_slice}
        inputs |= calibrated.inputs()
    if aux_layers is not None:
        key_slice = {**key_slice, "aux_layers": list(aux_layers)}

    def produce(job: StageJob) -> None:
        c_dir = job[calibrate].dir if calibrate is not None else None
        ir_dir = job[quantize].dir
        run_export(
            ir_dir,
            recipe.export,
            recipe.kv_cache,
            job.out,
            calibration_dir=c_dir,
            aux_layers=aux_layers,
        )

    return Stage(f"{prefix}export", ExportOutput, key_slice, inputs, produce)


def run_export(
    ir_dir: Path,
    export: Export,
    kv_cache: KvCache,
    out: Path,
    *,
    calibration_dir: Path | None = None,
    aux_layers: tuple[int, ...] | None = None,
) -> None:
    """Write the graph and ``graph.json``; an int8 / fp8 ``kv_cache`` needs the calibrate
    stage's output ``calibration_dir`` for its scales; ``aux_layers`` (an EAGLE-3 draft's)
    adds the ``aux_hidden`` output."""
    scales = None
    if kv_cache.quantized:
        if calibration_dir is None:
            raise ValueError(f"export: kv_cache.dtype {kv_cache.dtype} needs calibration windows")
        work = out / _KV_WORK
        work.mkdir()
        try:
            scales = calibrate_kv_scales(
                IRLayers(ir_dir),
                CalibrationSet.load(calibration_dir),
                kv_cache.dtype,
                work,
                device=read_device_settings(calibration_dir).device,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    graph = export_onnx(
        IRLayers(ir_dir),
        out,
        max_seq_len=export.max_seq_len,
        kv_dtype=kv_cache.dtype,
        kv_block_size=kv_cache.block_size,
        kv_scales=scales,
        aux_layers=aux_layers,
    )
    (out / ExportOutput.GRAPH_INFO).write_text(json.dumps(graph, indent=2, sort_keys=True) + "\n")


def rounding_as_exported(source: LayerSource, export_dir: Path) -> LayerSource:
    """``source`` (the quantize stage's IR) as the graph in ``export_dir`` must be checked
    against it: its layers rounding their K/V with the graph's scales when its KV cache is
    int8 / fp8; else ``source`` itself (also for a directory without ``graph.json``: the
    check then names any KV dtype the IR does not round to)."""
    scales = _kv_scales(export_dir) if (export_dir / ExportOutput.GRAPH_INFO).is_file() else None
    return source if scales is None else KVQuantLayers(source, scales)


def _kv_scales(export_dir: Path) -> KVScales | None:
    graph = json.loads((export_dir / ExportOutput.GRAPH_INFO).read_text())
    if "kv_scales" not in graph:
        return None
    return KVScales.from_json(graph["kv_dtype"], graph["kv_scales"])
