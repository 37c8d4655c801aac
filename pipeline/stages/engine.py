"""Stage: build one engine target from the exported graph and check it against the IR.

The target's engine plug-in (`ENGINE_BUILDERS`, by ``target.engine``) builds the engine from
the exported graph; the written engine is then opened as the runtime will run it (the
plug-in's `open`) and checked (`GraphCheck`) against the quantize stage's IR, read one layer
at a time (`IRLayers`; with an int8 / fp8 KV cache its layers round their K/V with the export
stage's scales: `rounding_as_exported`). What is checked is the engine that ships: its files,
its fusions, its kernels.

An engine that does not compute exactly (ONNX Runtime at `matmul_accuracy_level: 4`: int8
activations) can only be checked loosely (0.5 of the logit scale: it catches gross errors,
not one layer's swapped heads), so first the plug-in's exact variant of the same compiled graph
(ORT: optimized in memory at the target's level with MatMulNBits at accuracy level 0; not
saved) is checked exactly. Its report is ``check.json``'s ``exact_check``. The IR's side of
the comparison is computed once, by the exact check, and the engine's check reuses it
(`GraphCheck`).

An engine that keeps an int8 cache in a form of its own (OpenVINO: u8 blocks with in-block
scales and zero points, not the graph's calibrated per-head codes; the plug-in's `own_kv`) is
checked against the IR with its K/V unrounded (fp32): the check cannot read the engine's
blocks to adopt rounding ties, and the engine's rounding is not the IR's. Its exact variant
(an fp32 cache) is checked first, exactly; the engine itself loosely (the "int8_activations"
tolerance), its logits and greedy tokens against the IR's.

One engine holds the weights at a time: the exact variant is released before the engine is
built, the build's before the built engine opens. A mismatch raises `ExportError`, so the
stage fails and the cache keeps nothing.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ingot.artifacts import EngineInfo
from ingot.runtime.loader import EngineFiles

from ..engines import ENGINE_BUILDERS
from ..engines.base import EngineBuilder, EngineTarget, engine_name, reads_graph
from ..export.check import GraphCheck
from ..export.decoder import rope_length
from ..export.errors import ExportError
from ..quantize.ir_layers import IRLayers
from .export import ExportOutput, rounding_as_exported
from .quantize import QuantizeOutput
from .stage import Stage, StageOutput

__all__ = ["EngineOutput", "engine_stage", "run_engine"]

EXACT_CHECK = "exact_check"  # check.json's key for the exact check of an inexact engine


@dataclass(frozen=True, slots=True)
class EngineOutput(StageOutput):
    """The engine's files (what its plug-in writes: the record's `path` names the one the
    runtime opens), ``engine.json`` (the plug-in's record) and ``check.json`` (the check
    against the IR)."""

    RECORD: ClassVar[str] = "engine.json"
    CHECK: ClassVar[str] = "check.json"

    def record(self) -> dict[str, Any]:
        """engine.json: the manifest's engine entry before it is placed in the artifact."""
        return self._json(self.RECORD)

    def check(self) -> dict[str, Any]:
        """check.json: the engine against the IR (the manifest's `build.check`)."""
        return self._json(self.CHECK)

    def files(self, export: ExportOutput) -> EngineFiles:
        """The engine as the runtime opens it (runtime/loader.py): the graph interface of
        the export it was built from (`export`), its record and its engine file (the graph
        itself for an engine built at load from it)."""
        record = self.record()
        path = _engine_file(record, self.dir, export.dir / ExportOutput.GRAPH)
        return EngineFiles(export.interface(), EngineInfo.model_validate(record), path)


def _engine_file(record: dict[str, Any], engine_dir: Path, graph: Path) -> Path:
    return graph if reads_graph(record) else engine_dir / Path(record["path"]).name


def engine_stage(
    prefix: str,
    target: EngineTarget,
    export: Stage[ExportOutput],
    quantize: Stage[QuantizeOutput],
) -> Stage[EngineOutput]:
    """One target's engine stage of one model (`prefix` "" or "draft-"), keyed on the target
    entry, the graph and the IR (it checks the engine it builds against the IR)."""
    return Stage(
        f"{prefix}engine:{engine_name(target)}",
        EngineOutput,
        target.model_dump(mode="json"),
        {"export": export, "quantize": quantize},
        lambda job: run_engine(job[export].dir, job[quantize].dir, target, job.out),
    )


def run_engine(export_dir: Path, ir_dir: Path, target: EngineTarget, out: Path) -> None:
    """Write the engine files, ``engine.json`` (its record) and ``check.json`` (the check's
    report) into ``out``."""
    builder = ENGINE_BUILDERS.get(target.engine)
    graph = export_dir / ExportOutput.GRAPH
    own_kv = builder.own_kv(_kv_dtype(export_dir))
    # One IR reference for both checks of an inexact engine (`GraphCheck`): exact first.
    ir = IRLayers(ir_dir)
    window = ir.cfg.sliding_window  # for an engine that applies it itself
    source = ir if own_kv else rounding_as_exported(ir, export_dir)
    # The reference rotates with the graph's one RoPE table (LongRoPE: rope.py).
    check_ir = GraphCheck(source, rope_len=rope_length(graph))
    exact = _exact_check(builder, graph, check_ir, target, window)
    record = builder.build(graph, target, out)
    gc.collect()  # the build's copy of the weights goes before the engine's loads them
    runner = builder.open(graph, out, record, sliding_window=window)
    accuracy = "int8_activations" if own_kv else builder.accuracy(target)
    try:
        check = check_ir(runner, accuracy=accuracy)
    except ExportError as e:
        raise ExportError(f"engine {engine_name(target)}: {e}") from None
    finally:
        del runner  # the weights go before anything else is written
        gc.collect()
    if exact is not None:
        check[EXACT_CHECK] = exact
    _write_json(out / EngineOutput.RECORD, record)
    _write_json(out / EngineOutput.CHECK, check)


def _kv_dtype(export_dir: Path) -> str:
    """The exported graph's kv_dtype (graph.json); fp32 for a directory without graph.json (a
    graph checked on its own, as `rounding_as_exported` takes it)."""
    if not (export_dir / ExportOutput.GRAPH_INFO).is_file():
        return "fp32"
    return ExportOutput(export_dir, "").graph_info()["kv_dtype"]


def _exact_check(
    builder: EngineBuilder,
    graph: Path,
    check_ir: GraphCheck,
    target: EngineTarget,
    window: int | None,
) -> dict[str, Any] | None:
    """`check_ir` "exact" on the builder's exact variant of the graph, where the engine is not
    exact and has one; None otherwise."""
    exact = builder.exact(graph, target, sliding_window=window)
    if exact is None:
        return None
    runner, what = exact
    del exact
    try:
        return check_ir(runner, accuracy="exact")
    except ExportError as e:
        raise ExportError(
            f"engine {engine_name(target)}: the exact check ({what}) failed: {e}"
        ) from None
    finally:
        del runner  # its weights go before the engine's build loads them
        gc.collect()


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
