"""Export the model IR to standard opset-23 ONNX with a paged-KV graph interface (decoder.py),
and the engine-neutral check of a graph against the IR (check.py).

Imports ingot.common, pipeline.model (the IR it exports), the engine builders' interface
(pipeline/engines/base.py), torch, onnx, numpy and ml_dtypes; no stage, no runtime.
"""

from .decoder import DATA_FILE, MODEL_FILE, OPSET, export_onnx
from .errors import ExportError

__all__ = ["export_onnx", "ExportError", "OPSET", "MODEL_FILE", "DATA_FILE"]
