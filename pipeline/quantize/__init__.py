"""Quantization: the layer-sequential walk over the model (driver.py, layerwise.py) that
calibrates and rounds one decoder layer at a time through the quantization methods (method.py:
the `QuantMethod` interface and its registry; methods/: one plug-in each; rtn.py, gptq.py,
awq.py, smoothquant.py, fp8.py: their torch kernels), the IR checkpoint it writes
(checkpoint.py, ir_layers.py) and the quantized KV cache's scales (kv_scales.py).

Imports ingot.common, ingot.calibration and ingot.pipeline.model. method.py, fields.py and
methods/ import no torch at module level: the recipe and `ingot inspect` read them.
"""
