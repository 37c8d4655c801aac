"""Route A: ingot's portable graph (model.onnx) read as it is by OpenVINO's ONNX frontend.

It converts and compiles on the CPU plugin (openvino 2026.4): DequantizeLinear -> MatMul
becomes an int4 FullyConnected, RotaryEmbedding and RMSNormalization its RoPE and RMS kernels,
opset-23 Attention a ScaledDotProductAttention. But the graph interface is kept literally: the
pool's ScatterND becomes ScatterNDUpdate, which writes a new pool tensor (OpenVINO cannot bind
an output to an input's memory as ONNX Runtime's IOBinding does), and the paged read stays a
Gather of every listed block before attention. So the runner here copies each layer's pool
output back into the pool after every call: a copy of the whole pool per call, on top of the
gather the issue wants gone. `layer_counts` reports what the plugin made of the graph.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import openvino as ov

from ingot.runtime.batch import STEP_INPUTS, Batch
from ingot.runtime.kv_pool import KVPool

__all__ = ["RouteARunner", "layer_counts", "op_counts"]


def op_counts(model: ov.Model) -> dict[str, int]:
    return dict(Counter(op.get_type_name() for op in model.get_ops()).most_common())


def layer_counts(compiled: ov.CompiledModel) -> dict[str, int]:
    """Node types of the plugin's runtime graph (what actually runs)."""
    ops = compiled.get_runtime_model().get_ops()
    return dict(Counter(op.get_rt_info()["layerType"].astype(str) for op in ops).most_common())


class RouteARunner:
    """ingot's `ModelRunner` over the converted portable graph and an ingot pool."""

    writes_pool = True

    def __init__(self, graph: Path | str, pool: KVPool, config: dict) -> None:
        core = ov.Core()
        self.model = core.read_model(str(graph))
        self.compiled = core.compile_model(self.model, "CPU", config)
        self._request = self.compiled.create_infer_request()
        self.pool = pool
        self._names = {i.get_any_name() for i in self.compiled.inputs}

    @property
    def scratch_block(self) -> int:
        return self.pool.scratch_block

    def run(self, batch: Batch) -> tuple[np.ndarray, list]:
        feed = {n: getattr(batch, n) for n in STEP_INPUTS if n in self._names}
        for layer in range(self.pool.num_layers):
            feed[f"k_pool_{layer}"] = self.pool.k[layer]
            feed[f"v_pool_{layer}"] = self.pool.v[layer]
        out = self._request.infer(feed, share_inputs=True)
        for layer in range(self.pool.num_layers):  # ScatterNDUpdate wrote new tensors
            np.copyto(self.pool.k[layer], out[f"k_pool_out_{layer}"])
            np.copyto(self.pool.v[layer], out[f"v_pool_out_{layer}"])
        return out["logits"], []
