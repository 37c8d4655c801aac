"""Issue 27's spike: candidate engines for ingot's model measured beside its ONNX Runtime engine.

`openvino`: ingot's own int4 weights rebuilt as an OpenVINO model (weight-compressed MatMuls,
the PagedAttention operation over ingot's block tables) driven by ingot's own Generator
(benchmarks/spike/openvino.py; the OpenVINO side runs in benchmarks/.venvs/openvino).
"""
