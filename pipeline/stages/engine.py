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

One engine holds the weights at a time: the exact variant is released before the engine is
built, the build's before the built engine opens. A mismatch raises `ExportError`, so the
stage fails and the cache keeps nothing.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from ..engines import ENGINE_BUILDERS
from ..engines.base import EngineBuilder, EngineTarget, engine_name
from ..export import MODEL_FILE
from ..export.check import GraphCheck
from ..export.errors import ExportError
from ..quantize.ir_layers import IRLayers
from .export import rounding_as_exported

__all__ = ["run_engine", "engine_name", "ENGINE_RECORD", "CHECK_REPORT"]

ENGINE_RECORD, CHECK_REPORT = "engine.json", "check.json"
EXACT_CHECK = "exact_check"  # check.json's key for the exact check of an inexact engine


def run_engine(export_dir: Path, ir_dir: Path, target: EngineTarget, out: Path) -> None:
    """Write the engine files, ``engine.json`` (its record) and ``check.json`` (the check's
    report) into ``out``."""
    builder = ENGINE_BUILDERS.get(target.engine)
    graph = export_dir / MODEL_FILE
    # One IR reference for both checks of an inexact engine (`GraphCheck`): exact first.
    check_ir = GraphCheck(rounding_as_exported(IRLayers(ir_dir), export_dir))
    exact = _exact_check(builder, graph, check_ir, target)
    record = builder.build(graph, target, out)
    gc.collect()  # the build's copy of the weights goes before the engine's loads them
    runner = builder.open(out, record)
    try:
        check = check_ir(runner, accuracy=builder.accuracy(target))
    finally:
        del runner  # the weights go before anything else is written
        gc.collect()
    if exact is not None:
        check[EXACT_CHECK] = exact
    _write_json(out / ENGINE_RECORD, record)
    _write_json(out / CHECK_REPORT, check)


def _exact_check(
    builder: EngineBuilder, graph: Path, check_ir: GraphCheck, target: EngineTarget
) -> dict[str, Any] | None:
    """`check_ir` "exact" on the builder's exact variant of the graph, where the engine is not
    exact and has one; None otherwise."""
    exact = builder.exact(graph, target)
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
