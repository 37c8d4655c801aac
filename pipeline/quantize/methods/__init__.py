"""The built-in quantization methods, one plug-in module each (`quantize.method.QuantMethod`,
registered in `quantize.method.QUANT_METHODS`): rtn, gptq, awq, smoothquant, fp8.

A method module imports quantize/method.py and fields.py, pipeline.model's torch-free modules
and pydantic at module level; its torch kernels (quantize/rtn.py, gptq.py, ...) inside the
functions the layer walk calls, so the recipe and `ingot inspect` import no torch.
"""
