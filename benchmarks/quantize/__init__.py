"""Quantization quality, speed and memory: ingot's methods against llm-compressor's (quantize,
w8a8_quality), the GPTQ ablation (gptq_ablation), the fast engine defaults' cost
(fast_defaults), quantized KV caches (kv_cache), W8A8 / FP8 engine speed (w8a8_speed)."""
