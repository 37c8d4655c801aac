"""One job of the llama.cpp spike in a fresh process (harness.launch):

    python -m benchmarks.spike.llamacpp_worker SPEC.json RESULT.json

Kinds: `decode` (benchmarks/decode/engines.py's timed greedy decoding) and `kv_check`
(llamacpp_kv.py: llama.cpp's per-sequence KV operations against fresh decodes).

Engines:

- `ingot`: the artifact's ONNX Runtime engine through ingot's Generator, its pool sized for
  the case (openvino_worker.load_ingot);
- `llama.cpp`: llama-cpp-python's batch API over the GGUF ingot wrote into the same artifact
  (engines.load_llama_cpp: one sequence id per prompt, all decoded together; the load spec's
  `kv_type` picks the K/V cache's type);
- `onnxruntime-ggml`: ingot's engine with the onnxruntime-ggml provider first (ort_ggml.py),
  in that package's own virtualenv.
"""

from __future__ import annotations

from typing import Any

from benchmarks.decode import engines
from benchmarks.harness.launch import worker_main
from benchmarks.spike import openvino_worker  # noqa: F401  (registers the sized `ingot`)

__all__ = ["run_spec"]


def load_on_ggml(**load: Any) -> engines.Runner:
    from benchmarks.spike.ort_ggml import load_ingot_on_ggml

    return load_ingot_on_ggml(**load)


engines.ENGINES["onnxruntime-ggml"] = load_on_ggml


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "kv_check":
        from benchmarks.harness.machine import memory_status
        from benchmarks.spike.llamacpp_kv import run_kv_check

        try:
            return {"ok": True, **run_kv_check(spec)} | memory_status()
        except Exception as e:  # recorded in the report, never dropped
            return {"ok": False, "error": f"{type(e).__name__}: {e}"} | memory_status()
    return engines.run_spec(spec)


if __name__ == "__main__":
    worker_main(run_spec)
