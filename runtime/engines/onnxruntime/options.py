"""ONNX Runtime session options: an engine's, from its record, and a drafter graph's."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from ingot.runtime.engines.base import SessionError

__all__ = ["OPTIMIZATION_LEVELS", "draft_session_options", "engine_session_options"]

# A record's (or a recipe's) level name -> ORT's.
OPTIMIZATION_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def engine_session_options(recorded: dict[str, Any]) -> ort.SessionOptions:
    """The options an engine's record (``session_options``) says to open it with.

    The session opens the engine file by path: ORT memory-maps its external data itself (no
    weight passes through Python) and prepacks each MatMulNBits weight into its kernel's
    layout, releasing the mapped original. Prepacking stays on: without it the weights stay
    mapped and the load is near-instant, but the int8-activation kernels run ~80x slower
    (1B shape: 0.17 against 12.9 tok/s; benchmarks/scale/coldstart.py --no-prepack)."""
    options = ort.SessionOptions()
    # The graph was optimized at build time; re-optimizing could change the numerics the
    # artifact was evaluated with, so the recorded level (normally disable_all) is honoured.
    level = recorded.get("graph_optimization_level", "disable_all")
    if level not in OPTIMIZATION_LEVELS:
        allowed = ", ".join(OPTIMIZATION_LEVELS)
        raise SessionError(f"session_options.graph_optimization_level {level!r} not in {allowed}")
    options.graph_optimization_level = OPTIMIZATION_LEVELS[level]
    threads = recorded.get("intra_op_num_threads", 0)
    if not isinstance(threads, int) or threads < 0:
        raise SessionError(
            f"session_options.intra_op_num_threads must be an int >= 0, got {threads!r}"
        )
    options.intra_op_num_threads = threads  # 0 = one per physical core
    unknown = sorted(set(recorded) - {"graph_optimization_level", "intra_op_num_threads"})
    if unknown:
        raise SessionError(f"session_options: unknown keys {unknown}")
    return options


def draft_session_options() -> ort.SessionOptions:
    """Options of a drafter's graph beside the target's session: one thread that does not spin
    between calls (a second pool of spinning threads would take the cores from the target's
    calls, and a draft is small enough that one thread runs it about as fast: DraftModel.open),
    optimized at load: a draft only proposes, the target's verification decides every token,
    so its rounding moves acceptance, not output."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options
