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
from pathlib import Path

from ingot.calibration.dataset import CalibrationSet

from ..export import export_onnx
from ..model.kv_quant import KVQuantLayers, KVScales
from ..model.layer_source import LayerSource
from ..quantize.ir_layers import IRLayers
from ..quantize.kv_scales import calibrate_kv_scales
from ..recipe.export import Export, KvCache
from .calibrate import read_device_settings

__all__ = ["run_export", "rounding_as_exported", "GRAPH_INFO"]

GRAPH_INFO = "graph.json"
_KV_WORK = ".kv-calibration"  # a dot-name: never part of the output's digest


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
    (out / GRAPH_INFO).write_text(json.dumps(graph, indent=2, sort_keys=True) + "\n")


def rounding_as_exported(source: LayerSource, export_dir: Path) -> LayerSource:
    """``source`` (the quantize stage's IR) as the graph in ``export_dir`` must be checked
    against it: its layers rounding their K/V with the graph's scales when its KV cache is
    int8 / fp8; else ``source`` itself (also for a directory without ``graph.json``: the
    check then names any KV dtype the IR does not round to)."""
    file = export_dir / GRAPH_INFO
    graph = json.loads(file.read_text()) if file.is_file() else {}
    if "kv_scales" not in graph:
        return source
    return KVQuantLayers(source, KVScales.from_json(graph["kv_dtype"], graph["kv_scales"]))
