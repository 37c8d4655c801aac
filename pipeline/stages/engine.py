"""Stage: build one engine target from the exported graph and check it against the IR.

ONNX Runtime optimizes the exported graph and writes the engine; the written engine is then
opened as the runtime opens it and checked (`check_graph`) against the quantize stage's IR,
read one layer at a time (`IRLayers`; with an int8 / fp8 KV cache its layers round their K/V
with the export stage's scales: `rounding_as_exported`). What is checked is the engine that
ships: its files, its fusions, its MatMulNBits accuracy level, the runtime's kernels.

At `matmul_accuracy_level: 4` (int8 activations) that check can only be loose (0.5 of the
logit scale: it catches gross errors, not one layer's swapped heads), so first the same
exported graph is optimized in memory at the target's level with MatMulNBits at accuracy
level 0 (fp32 activations; not saved) and checked exactly: the same fusions, exact numbers.
Its report is ``check.json``'s ``exact_check``. The IR's side of the comparison is computed
once, by the exact check, and the engine's check reuses it (`GraphCheck`).

One session holds the weights at a time: the exact check's session is released before the
engine is built, the optimizing one before the checked one opens. A mismatch raises
`ExportError`, so the stage fails and the cache keeps nothing.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from ..engines.onnxruntime import (
    build_onnxruntime_engine,
    load_onnxruntime_engine,
    ort_optimization_level,
)
from ..export.check import GraphCheck, session_options
from ..export.errors import ExportError
from ..quantize.ir_layers import IRLayers
from ..recipe.targets import Target
from .export import rounding_as_exported

__all__ = ["run_engine", "engine_name", "check_accuracy", "ENGINE_RECORD", "CHECK_REPORT"]

ENGINE_RECORD, CHECK_REPORT = "engine.json", "check.json"
EXACT_CHECK = "exact_check"  # check.json's key for the level-0 check of a level-4 target


def engine_name(target: Target) -> str:
    return f"{target.engine}-{target.device}"


def check_accuracy(target: Target) -> str:
    """How the engine computes, for the check's tolerance: int8 activations at MatMulNBits
    accuracy level 4, else exact (fp32)."""
    return "int8_activations" if target.matmul_accuracy_level == 4 else "exact"


def run_engine(export_dir: Path, ir_dir: Path, target: Target, out: Path) -> None:
    """Write the engine files, ``engine.json`` (its record) and ``check.json`` (the check's
    report) into ``out``."""
    if target.engine != "onnxruntime":  # the recipe's union admits only built engines
        raise ValueError(f"targets: engine {target.engine!r} has no builder")
    # One IR reference for both checks of a level-4 target (`GraphCheck`): exact first.
    check_ir = GraphCheck(rounding_as_exported(IRLayers(ir_dir), export_dir))
    exact = None
    if check_accuracy(target) != "exact":
        exact = _exact_check(export_dir, check_ir, target)
    record = build_onnxruntime_engine(
        export_dir / "model.onnx",
        out,
        optimization_level=target.optimization_level,
        intra_op_num_threads=target.intra_op_num_threads,
        matmul_accuracy_level=target.matmul_accuracy_level,
    )
    session = load_onnxruntime_engine(out / Path(record["path"]).name, record["session_options"])
    try:
        check = check_ir(session, accuracy=check_accuracy(target))
    finally:
        del session  # the weights go before anything else is written
        gc.collect()
    if exact is not None:
        check[EXACT_CHECK] = exact
    _write_json(out / ENGINE_RECORD, record)
    _write_json(out / CHECK_REPORT, check)


def _exact_check(export_dir: Path, check_ir: GraphCheck, target: Target) -> dict[str, Any]:
    """`check_ir` "exact" on the exported graph optimized in memory as the target optimizes
    it, but with MatMulNBits at accuracy level 0 (fp32 activations); nothing is written."""
    import onnxruntime as ort

    options = session_options("exact")  # session.qdq_matmulnbits_accuracy_level = "0"
    options.graph_optimization_level = ort_optimization_level(target.optimization_level)
    options.intra_op_num_threads = target.intra_op_num_threads
    options.log_severity_level = 3  # level "all" warns that its graph is host specific
    onnx_path = export_dir / "model.onnx"
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    try:
        return check_ir(session, accuracy="exact")
    except ExportError as e:
        raise ExportError(
            f"engine {engine_name(target)}: the exact check (the graph at MatMulNBits accuracy "
            f"level 0, before the level-{target.matmul_accuracy_level} engine is built) "
            f"failed: {e}"
        ) from None
    finally:
        del session  # its weights go before the engine's session loads them
        gc.collect()


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
