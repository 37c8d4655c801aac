"""The compiled OpenVINO model as a session the Generator drives (generate.py `ModelRunner`):
ingot's scheduler, block tables and pool, OpenVINO's kernels.

The caches are the pool's own arrays (layout.py): each is handed to OpenVINO as a tensor over
the same memory (`set_tensor` once, at open), so the op's writes land in the pool and no call
copies them. `run` maps the Generator's batch onto the model's packed inputs (feed.py).
"""

from __future__ import annotations

import numpy as np
import openvino as ov

from ingot.runtime.batch import Batch
from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.openvino.feed import paged_feed
from ingot.runtime.kv_pool import KVPool

__all__ = ["OpenVinoSession"]


class OpenVinoSession:
    """`EngineRunner` over a compiled graph.py model and its pool. With `hidden` / `aux` the
    model has those outputs and the session keeps the last call's rows."""

    writes_pool = True  # the op writes each call's K/V into the pool

    __slots__ = ("_pool", "_request", "_outputs", "_hidden", "_aux")

    def __init__(self, compiled: ov.CompiledModel, pool: KVPool) -> None:
        self._pool = pool
        self._request = compiled.create_infer_request()
        for layer in range(pool.num_layers):
            for kind, arrays in (("key", pool.k), ("value", pool.v)):
                name = f"{kind}_cache.{layer}"
                _check_cache(compiled.input(name), arrays[layer], name)
                self._request.set_tensor(name, ov.Tensor(arrays[layer], shared_memory=True))
        self._outputs = {o.get_any_name(): i for i, o in enumerate(compiled.outputs)}
        self._hidden: np.ndarray | None = None
        self._aux: np.ndarray | None = None

    @property
    def scratch_block(self) -> int:
        # What build_inputs wants of a graph that writes the pool; the op never writes it
        # (padded rows are dropped before it: feed.py).
        return self._pool.scratch_block

    def run(self, batch: Batch) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """logits [N, V] float32 of the batch's `logits_indices` rows, and no K/V to write
        (the op wrote them). The arrays are the request's buffers, valid until the next
        call."""
        call = paged_feed(batch, self._pool.block_size)
        self._request.infer(call.feed, share_inputs=True)
        output = self._request.get_output_tensor
        if "hidden" in self._outputs:
            self._hidden = output(self._outputs["hidden"]).data  # [N, H]
        if "aux_hidden" in self._outputs:
            aux = output(self._outputs["aux_hidden"]).data  # [T, 3H], packed
            if call.rows is not None:  # the contract's rows: s*Q + q, padding zero
                padded = np.zeros((call.padded_rows, aux.shape[1]), aux.dtype)
                padded[call.rows] = aux
                aux = padded
            self._aux = aux
        return output(self._outputs["logits"]).data, []

    @property
    def hidden(self) -> np.ndarray:
        """hidden [N, H] float32 of the last call: the final-norm rows its logits came from,
        in the same order (valid until the next call)."""
        if self._hidden is None:
            why = "no call has run yet" if "hidden" in self._outputs else "opened without hidden"
            raise SessionError(f"no hidden rows: {why}")
        return self._hidden

    @property
    def aux_hidden(self) -> np.ndarray:
        """aux_hidden [S*Q, 3Ht] float32 of the last call, row s*Q + q for input_ids[s, q]
        (padded rows zero), valid until the next call: copy what is kept."""
        if self._aux is None:
            why = "no call has run yet" if "aux_hidden" in self._outputs else "opened without aux"
            raise SessionError(f"no aux_hidden rows: {why}")
        return self._aux


_TYPES = {
    ov.Type.f32: np.dtype(np.float32),
    ov.Type.f16: np.dtype(np.float16),
    ov.Type.u8: np.dtype(np.uint8),
}


def _check_cache(port: ov.ConstOutput, array: np.ndarray, name: str) -> None:
    """The compiled model's cache input is of the pool array's type and block shape (the
    plugin decides both: layout.py's shapes are what 2026.4's CPU plugin picks)."""
    element, dims = port.get_element_type(), port.get_partial_shape()
    block = tuple(d.get_length() if d.is_static else -1 for d in list(dims)[1:])
    if _TYPES.get(element) != array.dtype or block != array.shape[1:]:
        raise SessionError(
            f"{name}: the compiled model's cache is {element} blocks {list(block)}, the pool "
            f"{array.dtype} blocks {list(array.shape[1:])} (an OpenVINO other than the one "
            "layout.py describes?)"
        )
