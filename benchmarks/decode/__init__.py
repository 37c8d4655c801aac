"""Decode speed: ingot against onnxruntime-genai and llama.cpp (decode), where the batch-1 gap
is (batch1_gap), what ONNX Runtime's kernels allow (kernel_ceiling), a runtime choice against
its alternative (prefill_split), this checkout against an earlier revision (ab_revisions),
whole generate calls timed from outside, decode's independent check (whole_call).
Also the models (models), the decode artifact (artifact) and the engine worker (engines) that
other groups' benchmarks reuse."""
