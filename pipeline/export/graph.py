"""A minimal ONNX graph builder whose initializers stream straight into one external data file.

Weights never sit in the ModelProto: each initializer is appended to ``<model>.data`` as it is
created and the proto only records (location, offset, length). So peak memory stays at about one
tensor, and names, order and offsets depend only on the emission order: exports are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np
import torch
from onnx import TensorProto, helper

__all__ = ["GraphBuilder", "pack_int4"]

# Large tensors start on a page boundary so ORT can mmap them; small ones on a cache line.
_PAGE, _LINE, _PAGE_ALIGN_FROM = 4096, 64, 1 << 20
_BLOCK_BYTES = 32 << 20  # rows copied (transposed, packed) at a time by `rows` and `int4`

# numpy dtypes `_contiguous` copies through torch (which has no FP8 numpy interop)
_TORCH_COPYABLE = {
    np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64)
}

Buffer = bytes | bytearray | memoryview | np.ndarray

_NUMPY_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(ml_dtypes.float8_e4m3fn): TensorProto.FLOAT8E4M3FN,
}


def pack_int4(values: np.ndarray) -> bytes:
    """ONNX INT4/UINT4 layout: row-major, two per byte, the first element in the low nibble."""
    flat = values.astype(np.int16).reshape(-1) & 0xF  # two's complement nibbles for INT4
    if flat.size % 2:
        flat = np.append(flat, 0)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def _row_blocks(value: np.ndarray, multiple: int) -> Iterator[np.ndarray]:
    """Contiguous little-endian copies of consecutive row blocks of ``value`` (a multiple of
    ``multiple`` rows each, but the last), about `_BLOCK_BYTES` each."""
    if value.ndim < 2:
        yield _little_endian(np.ascontiguousarray(value))
        return
    row_bytes = max(1, value[0].nbytes)
    step = max(multiple, _BLOCK_BYTES // row_bytes // multiple * multiple)
    for start in range(0, value.shape[0], step):
        yield _little_endian(_contiguous(value[start : start + step]))


def _contiguous(value: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of a strided view (a transpose's rows). torch's blocked copy is
    ~4x numpy's element-strided one on a [K, N] int8 transpose, the bulk of an export."""
    if value.flags.c_contiguous:
        return value
    if value.dtype.byteorder == ">" or value.dtype not in _TORCH_COPYABLE:
        return np.ascontiguousarray(value)
    return torch.from_numpy(value).contiguous().numpy()


def _little_endian(value: np.ndarray) -> np.ndarray:
    if value.dtype.byteorder == ">":
        value = value.byteswap().view(value.dtype.newbyteorder("<"))
    return value


class GraphBuilder:
    """Collects nodes, graph inputs/outputs and external initializers, in emission order."""

    def __init__(self, data_file: BinaryIO, location: str) -> None:
        self._data, self._location = data_file, location
        self._offset = 0
        self._counts: dict[str, int] = {}
        self.nodes: list[Any] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []

    # ---- names -------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        """A deterministic unique name: ``prefix``, then ``prefix_1``, ``prefix_2``…"""
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return prefix if n == 0 else f"{prefix}_{n}"

    # ---- interface ---------------------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    # ---- nodes -------------------------------------------------------------------------------
    def op(
        self, op_type: str, inputs: list[str], name: str, out: str | None = None, **attrs
    ) -> str:
        """Emit one single-output node named ``name``; its output is ``out`` or ``name``."""
        node_name = self.fresh(name)
        output = out or node_name
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=node_name, **attrs))
        return output

    def split(self, x: str, sizes: list[int], name: str, outs: list[str | None]) -> list[str]:
        """Split ``x`` along its last axis into pieces of ``sizes``; ``outs`` names them (None:
        generated)."""
        node_name = self.fresh(name)
        outputs = [out or f"{node_name}_{i}" for i, out in enumerate(outs)]
        split = self.ints(f"{node_name}.sizes", sizes)
        self.nodes.append(helper.make_node("Split", [x, split], outputs, name=node_name, axis=-1))
        return outputs

    # ---- initializers ------------------------------------------------------------------------
    def raw(self, name: str, elem_type: int, dims: list[int], data: Buffer) -> str:
        """An external initializer from its raw little-endian bytes (any contiguous buffer)."""
        view = memoryview(data).cast("B")
        return self.stream(name, elem_type, dims, [view], view.nbytes)

    def stream(
        self, name: str, elem_type: int, dims: list[int], chunks: Iterable[Buffer], nbytes: int
    ) -> str:
        """An external initializer written chunk by chunk (``nbytes`` in all), so a large
        tensor never needs a second whole copy (a transposed or packed one) in memory."""
        align = _PAGE if nbytes >= _PAGE_ALIGN_FROM else _LINE
        pad = -self._offset % align
        self._data.write(b"\0" * pad)
        self._offset += pad
        tensor = TensorProto(name=self.fresh(name), data_type=elem_type, dims=dims)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self._location),
            ("offset", str(self._offset)),
            ("length", str(nbytes)),
        ):
            tensor.external_data.add(key=key, value=value)
        written = 0
        for chunk in chunks:
            if isinstance(chunk, np.ndarray):  # ml_dtypes' float8 has no buffer format
                chunk = chunk.reshape(-1).view(np.uint8)
            view = memoryview(chunk).cast("B")
            self._data.write(view)
            written += view.nbytes
        if written != nbytes:
            raise ValueError(f"{tensor.name}: wrote {written} bytes, announced {nbytes}")
        self._offset += nbytes
        self.initializers.append(tensor)
        return tensor.name

    def alias(self, name: str, of: str) -> str:
        """A second initializer over the bytes of initializer `of` (the same location, offset
        and length in the data file): stored once, read by two nodes as two tensors."""
        source = next(t for t in self.initializers if t.name == of)
        tensor = TensorProto(name=self.fresh(name), data_type=source.data_type, dims=source.dims)
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.extend(source.external_data)
        self.initializers.append(tensor)
        return tensor.name

    def array(self, name: str, value: np.ndarray) -> str:
        value = _little_endian(np.ascontiguousarray(value))
        elem_type = _NUMPY_TO_ONNX[value.dtype]
        return self.raw(name, elem_type, list(value.shape), value.reshape(-1).view(np.uint8))

    def rows(self, name: str, value: np.ndarray) -> str:
        """Like `array`, for a possibly non-contiguous 2-D view (a transpose): written a block
        of rows at a time, never copied whole."""
        elem_type = _NUMPY_TO_ONNX[value.dtype]
        return self.stream(name, elem_type, list(value.shape), _row_blocks(value, 1), value.nbytes)

    def int4(self, name: str, values: np.ndarray, signed: bool) -> str:
        """INT4 / UINT4 codes (one per int8 / uint8 element, any 2-D view), packed two per byte
        a block of rows at a time."""
        elem_type = TensorProto.INT4 if signed else TensorProto.UINT4
        nbytes = (values.size + 1) // 2
        # An even number of rows per block keeps every block but the last an even count of
        # nibbles, so packing block by block is packing the whole.
        blocks = (pack_int4(b) for b in _row_blocks(values, 2))
        return self.stream(name, elem_type, list(values.shape), blocks, nbytes)

    def ints(self, name: str, values: list[int]) -> str:
        """A small int64 vector (a shape) as an inline ``Constant`` node, not an initializer:
        shape inference must read it without opening the external data (onnx's never opens it;
        TensorRT's ONNX parser, which no engine uses yet, is the other reader it was kept for)."""
        value = helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
        return self.op("Constant", [], name, value=value)
