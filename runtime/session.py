"""One ONNX Runtime session over an engine file, with the KV pool bound in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ingot.runtime.kv_pool import KVPool

__all__ = ["EngineSession", "SessionError"]

_OPT_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_STEP_INPUTS = ("input_ids", "positions", "block_tables", "context_lens", "attention_mask")
_ORT_TYPES = {np.dtype(np.float32): "tensor(float)", np.dtype(np.float16): "tensor(float16)"}


class SessionError(RuntimeError):
    """The engine file does not have the graph interface the runtime binds."""


class EngineSession:
    """Runs the graph; the pool arrays are bound once as OrtValues that alias them.

    The pool is written in place between calls (KVPool.write), so the bound OrtValues see
    every write and no call ever copies the cache.
    """

    __slots__ = ("_session", "_binding", "_pool_values", "_outputs", "num_layers")

    def __init__(
        self,
        engine_file: Path | str,
        pool: KVPool,
        session_options: dict[str, Any] | None = None,
        profile_file_prefix: str | None = None,
    ) -> None:
        options = _session_options(session_options or {})
        if profile_file_prefix is not None:  # ORT's per-node profiler (benchmarks)
            options.enable_profiling = True
            options.profile_file_prefix = profile_file_prefix
        self._session = ort.InferenceSession(
            str(engine_file), options, providers=["CPUExecutionProvider"]
        )
        self.num_layers = pool.num_layers
        self._check_interface(pool)

        self._binding = self._session.io_binding()
        self._pool_values = []  # keeps the OrtValues (and so the aliases) alive
        for layer in range(pool.num_layers):
            for name, array in (
                (f"k_pool_{layer}", pool.k[layer]),
                (f"v_pool_{layer}", pool.v[layer]),
            ):
                value = ort.OrtValue.ortvalue_from_numpy(array)
                if value.data_ptr() != array.ctypes.data:
                    raise SessionError(f"{name}: binding copied the pool array; it must alias it")
                self._binding.bind_ortvalue_input(name, value)
                self._pool_values.append(value)
        self._outputs = ["logits"] + [
            f"new_{kv}_{layer}" for layer in range(pool.num_layers) for kv in ("k", "v")
        ]

    def run(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        attention_mask: np.ndarray,
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """logits [S, Q, V] float32 and per layer (new_k, new_v) [S, Q, Hkv, D]."""
        arrays = (input_ids, positions, block_tables, context_lens, attention_mask)
        for name, array in zip(_STEP_INPUTS, arrays, strict=True):
            self._binding.bind_cpu_input(name, np.ascontiguousarray(array))
        # Outputs change shape every call: rebind so ORT allocates them to this call's shape.
        self._binding.clear_binding_outputs()
        for name in self._outputs:
            self._binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(self._binding)
        logits, *kv = self._binding.copy_outputs_to_cpu()
        return logits, [(kv[2 * i], kv[2 * i + 1]) for i in range(self.num_layers)]

    def end_profiling(self) -> str:
        """Stop ORT's profiler; the path of the JSON trace it wrote (see `profile_file_prefix`)."""
        return self._session.end_profiling()

    def _check_interface(self, pool: KVPool) -> None:
        inputs = {i.name: i for i in self._session.get_inputs()}
        outputs = {o.name for o in self._session.get_outputs()}
        pool_inputs = [f"{kv}_pool_{i}" for i in range(pool.num_layers) for kv in ("k", "v")]
        new_kv = [f"new_{kv}_{i}" for i in range(pool.num_layers) for kv in ("k", "v")]
        problems = [
            f"missing input {n!r}" for n in (*_STEP_INPUTS, *pool_inputs) if n not in inputs
        ]
        problems += [f"missing output {n!r}" for n in ("logits", *new_kv) if n not in outputs]
        expected = _ORT_TYPES.get(pool.dtype)
        for name in pool_inputs:
            if name in inputs and inputs[name].type != expected:
                problems.append(f"input {name!r} is {inputs[name].type}, the pool is {expected}")
        if problems:
            raise SessionError("engine graph interface mismatch: " + "; ".join(problems))


def _session_options(recorded: dict[str, Any]) -> ort.SessionOptions:
    options = ort.SessionOptions()
    # The graph was optimized at build time; re-optimizing could change the numerics the
    # artifact was evaluated with, so the recorded level (normally disable_all) is honoured.
    level = recorded.get("graph_optimization_level", "disable_all")
    if level not in _OPT_LEVELS:
        allowed = ", ".join(_OPT_LEVELS)
        raise SessionError(f"session_options.graph_optimization_level {level!r} not in {allowed}")
    options.graph_optimization_level = _OPT_LEVELS[level]
    threads = recorded.get("intra_op_num_threads", 0)
    if not isinstance(threads, int) or threads < 0:
        raise SessionError(
            f"session_options.intra_op_num_threads must be an int >= 0, got {threads!r}"
        )
    options.intra_op_num_threads = threads  # 0 = one per physical core
    unknown = sorted(set(recorded) - {"graph_optimization_level", "intra_op_num_threads"})
    if unknown:
        raise SessionError(f"session_options: unknown keys {unknown}")
    return options
