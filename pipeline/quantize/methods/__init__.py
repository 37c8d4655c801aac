"""The built-in quantization methods, one plug-in module each (`quantize.method.QuantMethod`,
registered in `quantize.method.QUANT_METHODS`): rtn, gptq, awq, smoothquant, fp8."""
