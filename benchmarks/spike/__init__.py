"""Issue 27's spike: candidate engines and kernels for ingot's model, measured beside its ONNX
Runtime engine.

`openvino`: ingot's own int4 weights rebuilt as an OpenVINO model (weight-compressed MatMuls,
the PagedAttention operation over ingot's block tables) driven by ingot's own Generator
(benchmarks/spike/openvino.py; the OpenVINO side runs in benchmarks/.venvs/openvino).
`kernels`: kernels of our own (spike/kernels/: int4 g32 GEMV/GEMM with AVX-512 VNNI, paged
decode attention over ingot's pool) against MatMulNBits and gather + Attention.
`llamacpp`: the GGUF ingot writes beside the same weights, run by llama.cpp through
llama-cpp-python's batch API, and what its per-sequence KV operations do for ingot's scheduler
(llamacpp_kv.py); with onnxruntime-ggml (ingot's engine graph with the ggml provider first).
"""
