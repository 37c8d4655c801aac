"""Where the onnxruntime engine's files go, and how a graph the engine stage rewrote before
ONNX Runtime optimizes it (fp8_weights.py, qmoe.py) is written: the initializers no node reads
any more dropped, the rest beside it in one external data file, as the exporter writes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["DATA_FILE", "INLINE_MAX", "MODEL_FILE", "save_rewritten"]

MODEL_FILE, DATA_FILE = "model.onnx", "model.onnx.data"
INLINE_MAX = 1024  # bytes; initializers at least this big go to the external data file


def save_rewritten(model: onnx.ModelProto, out_dir: Path) -> None:
    """Write ``out_dir/model.onnx`` (+ ``model.onnx.data``) from ``model``, without the
    initializers its nodes no longer read (a rewrite's replaced weights)."""
    import onnx  # build-only, as fp8_weights.py / qmoe.py: build.py reads the names alone

    read = {i for n in model.graph.node for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(out_dir / MODEL_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=INLINE_MAX,
    )
