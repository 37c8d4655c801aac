"""The model IR in torch: a decoder (llama.py, layers.py) built from a model family's
description (family.py, families/) and its config.json (config.py), the quantized linear
(qlinear.py), the HF checkpoint read layer by layer (load.py, layer_source.py), a quantized KV
cache's rounding and scales (kv_rounding.py, kv_quant.py) and the speculative heads' models
(medusa.py, eagle3.py).

The bottom of the pipeline: imports ingot.common, torch and safetensors, no other pipeline
package. config.py, family.py, families/, architecture.py and selection.py import no torch:
the recipe reads them.
"""
