"""The reused output buffers an ONNX Runtime session writes each call's outputs into."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ingot.runtime.engines.base import SessionError

__all__ = ["OutputBuffers"]

_FLOAT8E4M3FN = 17  # onnx.TensorProto.FLOAT8E4M3FN (the runtime does not import onnx)
# An output's ORT type -> (numpy dtype of the buffer it is written into, the element type it is
# bound with). numpy has no float8: fp8 K/V land in uint8 buffers, bound with the ONNX type.
_OUTPUT_TYPES = {
    "tensor(float)": (np.float32, np.float32),
    "tensor(float16)": (np.float16, np.float16),
    "tensor(int8)": (np.int8, np.int8),
    "tensor(int64)": (np.int64, np.int64),  # an EAGLE layer's draft_tokens
    "tensor(float8e4m3fn)": (np.uint8, _FLOAT8E4M3FN),
}


class OutputBuffers:
    """numpy arrays ORT writes a call's outputs into, bound while the call's shape (S, Q, N)
    repeats, as it does every decode step of a steady batch: no allocation, no binding and no
    copy per step. A new shape allocates and binds new arrays. The `fixed` outputs (the pools
    a graph writes in place) are bound to their arrays always: again after every rebinding,
    which clears every output's binding."""

    __slots__ = ("_specs", "_key", "_arrays", "_fixed")

    def __init__(
        self,
        session: ort.InferenceSession,
        names: list[str],
        fixed: list[tuple[str, np.ndarray]] = (),
    ) -> None:
        self._fixed = list(fixed)
        meta = {o.name: o for o in session.get_outputs()}
        self._specs = []
        for name in names:
            dims = list(meta[name].shape)
            unknown = [d for d in dims if not isinstance(d, int) and d not in ("S", "Q", "N")]
            if unknown or meta[name].type not in _OUTPUT_TYPES:
                raise SessionError(f"output {name!r} is {meta[name].type} {dims}: not bindable")
            self._specs.append((name, *_OUTPUT_TYPES[meta[name].type], dims))
        self._key: tuple[int, ...] | None = None
        self._arrays: list[np.ndarray] = []

    def bind(self, binding: ort.IOBinding, **dims: int) -> list[np.ndarray]:
        key = tuple(dims.values())
        if key != self._key:
            binding.clear_binding_outputs()
            for name, array in self._fixed:
                shape = list(array.shape)
                binding.bind_output(name, "cpu", 0, array.dtype.type, shape, array.ctypes.data)
            self._arrays = []
            for name, dtype, element_type, shape in self._specs:
                concrete = [dims[d] if isinstance(d, str) else d for d in shape]
                array = np.empty(concrete, dtype)
                binding.bind_output(name, "cpu", 0, element_type, concrete, array.ctypes.data)
                self._arrays.append(array)
            self._key = key
        return self._arrays
