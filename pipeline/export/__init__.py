"""Export the model IR to standard opset-23 ONNX with a paged-KV graph interface, and check it."""

from .check import check_export
from .decoder import DATA_FILE, MODEL_FILE, OPSET, export_onnx
from .errors import ExportError

__all__ = ["export_onnx", "check_export", "ExportError", "OPSET", "MODEL_FILE", "DATA_FILE"]
