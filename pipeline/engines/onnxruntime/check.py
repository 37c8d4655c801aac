"""An exported graph checked against the IR on an ONNX Runtime CPU session (export/check.py's
criterion), for callers that hold a model and a graph rather than an engine stage's output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort

from ...export.check import Accuracy, check_graph
from ...export.decoder import rope_length
from ...export.errors import ExportError
from ...model.layer_source import LayerSource, ModelLayers
from ...model.llama import LlamaModel
from .session import OrtGraph, session_options

__all__ = ["check_export"]


def check_export(
    model: LlamaModel | LayerSource,
    onnx_path: Path,
    *,
    num_tokens: int = 24,
    seed: int = 0,
    rtol: float | None = None,
    accuracy: Accuracy = "exact",
    atol: float | None = None,
) -> dict[str, Any]:
    """`check_graph` on a CPU session over ``onnx_path`` built with `session_options`.

    ``model`` is a `LlamaModel` (wrapped in `ModelLayers`) or any `LayerSource`. ``atol``, if
    given, is an extra absolute bound on the logit and hidden differences (the criterion of
    earlier versions, kept for callers that still pass it).
    """
    source = ModelLayers(model) if isinstance(model, LlamaModel) else model
    session = ort.InferenceSession(
        str(onnx_path), session_options(accuracy), providers=["CPUExecutionProvider"]
    )
    try:
        report = check_graph(
            source,
            OrtGraph(session),
            num_tokens=num_tokens,
            seed=seed,
            rtol=rtol,
            accuracy=accuracy,
            rope_len=rope_length(onnx_path),
        )
    except ExportError as e:
        raise ExportError(f"{onnx_path}: {e}") from None
    worst = max(report["max_abs_logit_diff"], report["max_abs_hidden_diff"])
    if atol is not None and not worst <= atol:
        raise ExportError(
            f"{onnx_path}: exported graph disagrees with the IR beyond atol {atol}: {report}"
        )
    return report
