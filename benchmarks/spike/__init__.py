"""Issue 27's spike: candidate engines and kernels measured beside ONNX Runtime's."""
