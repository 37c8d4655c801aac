"""The OpenVINO engine's model (runtime/engines/openvino/graph.py, promoted from this spike) as
a session ingot's Generator drives: ingot's scheduler, block allocator and batches, OpenVINO's
kernels.

`OpenVinoRunner.run(batch)` takes the `Batch` the Generator built (build_inputs: padded
[S, Q] rows, block tables, context lengths, logits rows) and maps it onto PagedAttention's
inputs (the engine's feed.py): the real rows packed (T tokens), past_lens = context_lens,
subsequence_begins = the running sum of each sequence's new tokens, block_indices = each
table's blocks up to the call's last token, concatenated. The op writes the call's K/V into
the caches itself (`writes_pool`), at the slots the Generator reserved in the same tables.

The caches: f32 / f16 are the KVPool's own arrays, [NB + 1, B, Hkv, D] as the pool allocates
them, handed to OpenVINO as [NB + 1, Hkv, B, D] (the same bytes; nothing but the op reads
them, so the per-block layout is the engine's business). u8 blocks are bigger than the pool's
(per-block scales and zero points, the engine's layout.py): the runner allocates them itself
and the pool only lends its allocator (a pool of 1-byte "blocks"). Block size: 32, the CPU
plugin's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov

from ingot.runtime.batch import Batch
from ingot.runtime.engines.openvino.feed import paged_feed
from ingot.runtime.engines.openvino.graph import ModelShape, build_model
from ingot.runtime.engines.openvino.layout import CPU_BLOCK_SIZE
from ingot.runtime.engines.openvino.weights import GraphWeights
from ingot.runtime.kv_pool import KVPool

__all__ = ["OpenVinoRunner", "compile_config", "open_openvino"]

# bf16 caches are held as uint16: only the op reads or writes them (numpy has no bfloat16).
_NUMPY = {
    ov.Type.f32: np.float32,
    ov.Type.f16: np.float16,
    ov.Type.bf16: np.uint16,
    ov.Type.u8: np.uint8,
}


def compile_config(threads: int, precision: str, kv: str, dyn_quant: int) -> dict:
    """CPU plugin properties: `precision` the activations' (bf16: the plugin's default on
    this CPU; f32), `kv` the caches' element type (f32, f16, u8: the plugin's default),
    `dyn_quant` the int4 FullyConnected's activation quantization group (32: the
    default, 0: off)."""
    return {
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": precision,
        "KV_CACHE_PRECISION": kv,
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": dyn_quant,
    }


class OpenVinoRunner:
    """ingot's `ModelRunner` (generate.py) over the compiled model and its caches."""

    writes_pool = True

    def __init__(self, compiled: ov.CompiledModel, pool: KVPool, caches: list[np.ndarray]):
        self.pool = pool
        self._caches = caches  # keeps the arrays OpenVINO reads alive
        self._request = compiled.create_infer_request()
        for i, array in enumerate(caches):
            name = f"{'key' if i % 2 == 0 else 'value'}_cache.{i // 2}"
            self._request.set_tensor(name, _shared(array, compiled.input(name).get_element_type()))

    @property
    def scratch_block(self) -> int:
        return self.pool.scratch_block  # padded rows are dropped here, never written

    def run(self, batch: Batch) -> tuple[np.ndarray, list]:
        """logits [N, V] of the batch's logits rows (a view of the request's output, valid
        until the next call); no K/V to return: the op wrote them."""
        self._request.infer(paged_feed(batch, self.pool.block_size).feed, share_inputs=True)
        return self._request.get_output_tensor(0).data, []


def _shared(array: np.ndarray, element: ov.Type) -> ov.Tensor:
    """An OpenVINO tensor over `array`'s memory (no copy), of `element` type."""
    if element == ov.Type.bf16:  # held as uint16: the typed constructor shares the buffer
        return ov.Tensor(array, ov.Shape(list(array.shape)), element)
    return ov.Tensor(array, shared_memory=True)


def open_openvino(
    artifact: Path | str, num_blocks: int, config: dict, model_out: Path | None = None
) -> tuple[OpenVinoRunner, KVPool, dict]:
    """The artifact's weights compiled on OpenVINO's CPU plugin with `config`, a pool of
    `num_blocks` blocks of CPU_BLOCK_SIZE and its runner; plus what was built (the compiled
    caches' types and shapes, the compile time, the op counts of the runtime graph).
    `model_out`: also serialize the model there (an OpenVINO IR .xml / .bin)."""
    import time
    from collections import Counter

    # The spike's artifacts have no sliding window: the model is the engine's, windowless.
    weights = GraphWeights(Path(artifact) / "model.onnx")
    s = ModelShape.of(weights, None, aux=False)
    model = build_model(weights, s)
    if model_out is not None:
        ov.save_model(model, str(model_out), compress_to_fp16=False)
    started = time.perf_counter()
    compiled = ov.Core().compile_model(model, "CPU", config)
    compile_s = time.perf_counter() - started
    del weights, model  # the compiled model holds what it needs
    cache_inputs = [i for i in compiled.inputs if i.get_any_name().endswith(tuple("0123456789"))]
    cache_inputs = [i for i in cache_inputs if "_cache." in i.get_any_name()]
    element = cache_inputs[0].get_element_type()
    dtype = _NUMPY[element]
    if element == ov.Type.u8:
        pool = KVPool(s.num_layers, num_blocks, CPU_BLOCK_SIZE, 1, 1, np.uint8)  # the allocator
        block_shapes = [
            [d.get_length() for d in list(i.get_partial_shape())[1:]] for i in cache_inputs
        ]
        caches = [_zeros([num_blocks + 1, *shape], dtype) for shape in block_shapes]
    else:
        pool = KVPool(s.num_layers, num_blocks, CPU_BLOCK_SIZE, s.num_kv_heads, s.head_dim, dtype)
        shape = (num_blocks + 1, s.num_kv_heads, CPU_BLOCK_SIZE, s.head_dim)
        caches = [a.reshape(shape) for layer in zip(pool.k, pool.v, strict=True) for a in layer]
    runner = OpenVinoRunner(compiled, pool, caches)
    runtime = compiled.get_runtime_model()
    layers = Counter(op.get_rt_info()["layerType"].astype(str) for op in runtime.get_ops())
    info = {
        "compile_s": compile_s,
        "cache_type": str(element),
        "cache_shapes": [str(i.get_partial_shape()) for i in cache_inputs[:2]],
        "kv_bytes_per_token": sum(c[0].nbytes for c in caches) / CPU_BLOCK_SIZE,
        "runtime_layers": dict(layers.most_common()),
        "properties": {k: str(compiled.get_property(k)) for k in config},
    }
    return runner, pool, info


def _zeros(shape: list[int], dtype: type) -> np.ndarray:
    array = np.empty(shape, dtype)
    array.fill(0)  # written, not lazily mapped (kv_pool.py's reason)
    return array
