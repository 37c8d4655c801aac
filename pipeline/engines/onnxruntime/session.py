"""ONNX Runtime sessions the build checks: the written engine as the runtime opens it, a graph
at a pinned MatMulNBits accuracy level, and `OrtGraph`, a session as the `GraphRunner`
(engines/base.py) the IR check runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ingot.runtime.engines.onnxruntime.options import (
    OPTIMIZATION_LEVELS,
    engine_session_options,
)

from ..base import Accuracy

__all__ = [
    "ACCURACY_KEY",
    "OrtGraph",
    "load_onnxruntime_engine",
    "ort_optimization_level",
    "session_options",
]

ACCURACY_KEY = "session.qdq_matmulnbits_accuracy_level"
_ACCURACY_LEVEL = {"exact": "0", "int8_activations": "4"}  # ACCURACY_KEY's value per accuracy
# An input's ORT type -> its numpy dtype name (the graph interface's, artifacts' TensorSpec).
_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


def ort_optimization_level(name: str) -> ort.GraphOptimizationLevel:
    """ORT's GraphOptimizationLevel for a recipe's or a record's level name."""
    return OPTIMIZATION_LEVELS[name]


def session_options(accuracy: Accuracy = "exact") -> ort.SessionOptions:
    """ORT CPU session options for checking a graph: default optimizations (so ORT's fusions
    are checked too), MatMulNBits accuracy level pinned (0 = fp32 activations for "exact", 4 =
    int8 activations for "int8_activations"; ORT's own default is 4)."""
    if accuracy not in _ACCURACY_LEVEL:
        raise ValueError(f"accuracy: {accuracy!r} (allowed: {', '.join(_ACCURACY_LEVEL)})")
    options = ort.SessionOptions()
    options.add_session_config_entry(ACCURACY_KEY, _ACCURACY_LEVEL[accuracy])
    return options


def load_onnxruntime_engine(
    engine_file: Path, session_options: dict[str, Any]
) -> ort.InferenceSession:
    """The engine as the runtime opens it (runtime/engines/onnxruntime: its recorded session
    options, no re-optimization), prepacking on. The build checks this session against the IR:
    it runs the shipped files with the runtime's kernels, int8-activation MatMulNBits included
    (those need prepacked weights; without prepacking ORT computes them in fp32)."""
    options = engine_session_options(session_options)
    return ort.InferenceSession(str(engine_file), options, providers=["CPUExecutionProvider"])


class OrtGraph:
    """An `onnxruntime.InferenceSession` as the IR check runs a graph (`GraphRunner`)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session

    @property
    def inputs(self) -> dict[str, tuple[tuple[int | str, ...], str]]:
        """{name: (shape, numpy dtype name)} of the graph's inputs."""
        specs = self.session.get_inputs()
        return {i.name: (tuple(i.shape), _DTYPES.get(i.type, i.type)) for i in specs}

    @property
    def accuracy(self) -> Accuracy | None:
        """How the session computes its MatMulNBits where its options pin it; None where they
        do not (a session over an already-optimized graph has the level baked in)."""
        try:
            level = self.session.get_session_options().get_session_config_entry(ACCURACY_KEY)
        except RuntimeError:  # not set
            return None
        return {value: name for name, value in _ACCURACY_LEVEL.items()}.get(level)

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, dict(feed)), strict=True))
