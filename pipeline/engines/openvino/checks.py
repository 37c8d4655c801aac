"""What a recipe must be for the OpenVINO engine to run it, checked when the recipe loads.

- openvino installed (the optional extra ``ingot[openvino]``): the build compiles the model.
- KV blocks of 32 tokens: the CPU plugin's PagedAttention only runs those (it sets 32 on its
  cache inputs whatever the model says), and every engine of an artifact (and a draft model)
  shares one pool layout, so the recipe's kv_cache.block_size must be 32.
- KV dtype: fp32 and fp16 are the plugin's f32 / f16 caches, int8 its own u8 form (per-block
  scales and zero points inside the blocks); it has no fp8 cache.
- inference_precision bf16 with a float cache: the plugin keeps a float cache in the
  activations' precision whatever KV_CACHE_PRECISION says (measured: f16 asked, bf16
  compiled), and no kv_cache.dtype is bf16, so bf16 activations need kv_cache.dtype int8.
- Weights: the model is rebuilt from the exported graph's weights as OpenVINO's
  weight-compressed matmuls (int4 / int8 codes, minus their zero points, times their scales)
  or fp32 matmuls. Linears that quantize their own inputs (SmoothQuant W8A8, FP8 with input
  scales) compute with the graph's QuantizeLinear / integer MatMul, which that model does not
  reproduce, and FP8 weights have no form there: the runtime half refuses both
  (runtime/engines/openvino), so the recipe does first.
- The model: a mixture of experts has no OpenVINO form here (the rebuilt model has dense MLPs
  only; the exported graph's standard MoE block, export/moe.py, is not what it reads), so a
  model with sparse layers is refused before any stage.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ...quantize.method import Scheme, method_of

__all__ = ["CPU_BLOCK_SIZE", "model_problems", "recipe_problems"]

CPU_BLOCK_SIZE = 32  # the CPU plugin's only KV block size
_NO_KV = {"fp8": "OpenVINO's CPU plugin has no fp8 KV cache (use int8: its own u8 form)"}
_NO_SCHEME = {
    Scheme.W8A8: "int8 activations quantized by the graph (W8A8) are not rebuilt by the "
    "OpenVINO model (it quantizes activations itself: dynamic_quantization)",
    Scheme.FP8: "FP8 weights have no OpenVINO weight-compressed form here",
}


def recipe_problems(recipe: Any, target: Any, where: str) -> list[str]:
    """One line per part of ``recipe`` the OpenVINO ``target`` (at recipe path ``where``)
    cannot run, each naming the field."""
    problems = []
    if importlib.util.find_spec("openvino") is None:  # an optional extra: say so up front
        problems.append(
            f"{where}: engine openvino needs the openvino package, which is not installed "
            "(pip install 'ingot[openvino]')"
        )
    kv = recipe.kv_cache
    if kv.block_size != CPU_BLOCK_SIZE:
        problems.append(
            f"kv_cache.block_size: {kv.block_size}, but {where} (openvino) needs "
            f"{CPU_BLOCK_SIZE}, the only KV block size of OpenVINO's CPU plugin"
        )
    if kv.dtype in _NO_KV:
        problems.append(f"kv_cache.dtype: {kv.dtype} cannot run on {where}: {_NO_KV[kv.dtype]}")
    if kv.dtype in ("fp32", "fp16") and target.inference_precision == "bf16":
        problems.append(
            f"{where}.inference_precision: bf16 keeps a float KV cache in bf16, which "
            f"kv_cache.dtype {kv.dtype} is not (use f32, or kv_cache.dtype int8: the "
            "plugin's u8 form)"
        )
    for path, entries in recipe.quantize_lists().items():
        for index, entry in enumerate(entries):
            problems += _entry_problems(f"{path}.{index}", entry, where)
    return problems


def _entry_problems(at: str, entry: Any, where: str) -> list[str]:
    method = method_of(entry)
    scheme = method.scheme(entry)
    if scheme in _NO_SCHEME:
        return [f"{at}.method: {entry.method} cannot run on {where}: {_NO_SCHEME[scheme]}"]
    return []


def model_problems(cfg: Any, where: str) -> list[str]:
    """One line per part of the model (`ModelConfig` ``cfg``) the OpenVINO target at recipe
    path ``where`` cannot run."""
    if not cfg.moe_layers:
        return []
    return [
        f"{where}: engine openvino does not run a mixture of experts (config.json: "
        f"{cfg.num_experts} experts in layers {list(cfg.moe_layers)}); use engine onnxruntime"
    ]
