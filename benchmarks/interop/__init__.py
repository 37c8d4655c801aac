"""ingot's exports in their consumers: vLLM on the compressed-tensors W8A8 / FP8 checkpoints
(vllm_w8a8) and on the EAGLE-3 draft (vllm_eagle). Checks run by hand: vLLM is not in CI.
llama.cpp on the GGUF export is a row of decode.decode."""
