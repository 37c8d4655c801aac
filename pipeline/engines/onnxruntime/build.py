"""The ONNX Runtime CPU engine: the exported graph optimized once at build time and serialized.

The runtime loads the optimized graph with optimizations disabled, so a pod never re-optimizes
(and never depends on what a different ORT version would have fused). What the serialized graph
relies on is recorded: the ORT version range that can read its contrib ops (``MatMulNBits``…)
and, for level ``all``, the CPU features of the build host (ORT then emits layout- and
ISA-specific kernels and says the result "should only be used in the same environment").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

import onnxruntime as ort

from ..base import GRAPH_INITIALIZERS
from .rewrite import DATA_FILE, INLINE_MAX, MODEL_FILE
from .session import ort_optimization_level

__all__ = ["build_onnxruntime_engine", "host_cpu_isa", "ENGINE_NAME", "MODEL_FILE", "DATA_FILE"]

ENGINE_NAME = "onnxruntime-cpu"

# /proc/cpuinfo flag names MLAS dispatches on, in a fixed order (the record must be reproducible).
_X86_ISA = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
)
_ARM_ISA = ("asimd", "sve")


def host_cpu_isa(cpuinfo: str | None = None) -> list[str]:
    """The instruction-set extensions of this host that ORT's CPU kernels may use.

    Reads the ``flags`` (x86) or ``Features`` (arm) lines of /proc/cpuinfo; ``cpuinfo`` lets
    tests pass the text. Unreadable (non-Linux) hosts report none.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return [isa for isa in (*_X86_ISA, *_ARM_ISA) if isa in flags]


def build_onnxruntime_engine(
    onnx_path: Path,
    out_dir: Path,
    *,
    optimization_level: Literal["basic", "extended", "all"],
    intra_op_num_threads: int = 0,
    matmul_accuracy_level: int = 0,
) -> dict[str, Any]:
    """Optimize ``onnx_path`` with ORT and write ``out_dir/model.onnx`` + ``model.onnx.data``.

    ``out_dir`` is ``<artifact>/engines/onnxruntime-cpu``; the record's ``path`` is relative to
    the artifact root. ``matmul_accuracy_level`` is the compute type of the ``MatMulNBits`` nodes
    ORT fuses from DequantizeLinear -> MatMul: 0 keeps fp32 activations (the graph's exact
    semantics); 4 quantizes activations to int8 per block (faster on VNNI/AMX hosts, not exact).
    ORT's own default is 4, so it is always pinned explicitly here.

    The session that optimizes never runs, so it does not prepack: prepacking happens after the
    optimized graph is written (the files are the same bytes either way) and would only copy
    the weights into the kernels' layouts beside the fused initializers ORT keeps in its
    graph, about twice the int4 weights (docs/design.md, section 3). `load_onnxruntime_engine`
    then opens the written engine as the runtime does, for the check.
    """
    if optimization_level not in ("basic", "extended", "all"):
        raise ValueError(
            f"optimization_level: {optimization_level!r} (allowed: basic, extended, all)"
        )
    if matmul_accuracy_level not in (0, 1, 2, 3, 4):
        raise ValueError(f"matmul_accuracy_level: {matmul_accuracy_level} (allowed: 0-4)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (MODEL_FILE, DATA_FILE):  # ORT must not see (or append to) a previous build
        (out_dir / stale).unlink(missing_ok=True)

    options = _optimizing_options(
        out_dir, optimization_level, intra_op_num_threads, matmul_accuracy_level
    )
    # FP8 weights are dequantized here, once (fp8_weights.py: ORT's CPU kernel is scalar).
    folded_dir = out_dir / ".fp8-folded"  # a dot-name: never part of the stage's digest
    # onnx (a build-only package) loads when an engine is built, not when a recipe names
    # this engine's target
    from .fp8_weights import fold_fp8_weights

    folded = fold_fp8_weights(Path(onnx_path), folded_dir)
    source = folded_dir / MODEL_FILE if folded else Path(onnx_path)
    # Mixture-of-experts blocks become ORT's fused QMoE where their experts fit (qmoe.py).
    fused_dir = out_dir / ".qmoe-fused"  # a dot-name, as above
    from .qmoe import fuse_experts  # onnx: build-only, as above

    fused = fuse_experts(source, fused_dir, matmul_accuracy_level)
    source = fused_dir / MODEL_FILE if fused else source
    try:
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        del session  # written; its weights go now
    finally:
        shutil.rmtree(folded_dir, ignore_errors=True)
        shutil.rmtree(fused_dir, ignore_errors=True)
    if not (out_dir / MODEL_FILE).is_file():
        raise RuntimeError(f"onnxruntime did not write the optimized model to {out_dir}")
    # A tied int8 table: the lookup reads lm_head's MatMulNBits weights, the table once.
    from .shared_embedding import share_tied_embedding  # onnx: build-only, as above

    share_tied_embedding(out_dir / MODEL_FILE)

    record = _record(optimization_level, intra_op_num_threads, matmul_accuracy_level, folded)
    if fused:  # the experts' initializers are QMoE's, no longer the exported ones
        record["build"].update({GRAPH_INITIALIZERS: False, "qmoe_blocks": fused})
    return record


def _optimizing_options(
    out_dir: Path, optimization_level: str, intra_op_num_threads: int, matmul_accuracy_level: int
) -> ort.SessionOptions:
    """A session that optimizes at ``optimization_level`` and writes the result to
    ``out_dir/model.onnx`` (+ ``model.onnx.data``) instead of running."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort_optimization_level(optimization_level)
    # ORT warns that level "all" output is host specific: the record's cpu_isa says so instead.
    options.log_severity_level = 3
    options.intra_op_num_threads = intra_op_num_threads
    options.optimized_model_filepath = str(out_dir / MODEL_FILE)
    # Weights go to the external file (relative name). Tiny tensors must stay inline: ORT folds
    # shape Constants into initializers and cannot shape-infer a Reshape whose shape is external.
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", DATA_FILE
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(INLINE_MAX)
    )
    options.add_session_config_entry(
        "session.qdq_matmulnbits_accuracy_level", str(matmul_accuracy_level)
    )
    options.add_session_config_entry("session.disable_prepacking", "1")  # never runs
    return options


def _record(
    optimization_level: str, intra_op_num_threads: int, matmul_accuracy_level: int, folded: int
) -> dict[str, Any]:
    """The engine's record (engine.json): what a host needs, what the runtime applies, how it
    was built."""
    major, minor = (int(p) for p in ort.__version__.split(".")[:2])
    return {
        "name": ENGINE_NAME,
        "engine": "onnxruntime",
        "device": "cpu",
        "path": f"engines/{ENGINE_NAME}/{MODEL_FILE}",
        "requires": {
            "onnxruntime": f">={major}.{minor},<{major + 1}",
            # basic/extended graphs hold only portable (contrib) ops; "all" may hold
            # ISA-specific layouts, so it is pinned to the build host's features.
            "cpu_isa": host_cpu_isa() if optimization_level == "all" else [],
        },
        # What the runtime applies when it loads the engine: the graph is already optimized.
        "session_options": {
            "graph_optimization_level": "disable_all",
            "intra_op_num_threads": intra_op_num_threads,
        },
        # How the engine was built; the accuracy level is baked into the fused MatMulNBits.
        # Its file keeps the exported initializers' names (MatMulNBits' inputs are the
        # codes / scales / zero points renamed `<name>_T`): the artifact's one copy of the
        # weights, which an engine built at load (OpenVINO) reads (engines/base.py); not
        # where FP8 weights were folded to fp32 (no longer the exported weights).
        "build": {
            "optimization_level": optimization_level,
            "matmul_accuracy_level": matmul_accuracy_level,
            GRAPH_INITIALIZERS: not folded,
        }
        # FP8 weights dequantized at build time (fp8_weights.py), when the graph has any.
        | ({"fp8_weights_dequantized": folded} if folded else {}),
    }
