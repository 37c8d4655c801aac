"""ONNX Runtime sessions over graphs with ingot's paged-KV interface, the KV pool bound in place.

`EngineSession` runs the target's engine (logits, per layer new K/V, and on request its
`hidden` or `aux_hidden` rows); `EagleLayerSession` runs an EAGLE-3 draft layer, which takes
a `hidden` input beside the step inputs and returns greedy draft tokens instead of logits.
Both bind the pool once and write their outputs into reused buffers (`_PagedSession`).
`open_draft_graph` opens a drafter's small stateless graph (Medusa heads, EAGLE-3 fc). The
drafters' graphs are portable ONNX shipped beside the engines (draft/heads/, draft/eagle/):
the runtime runs them with ONNX Runtime whatever engine runs the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ingot.runtime.batch import LOCAL_INPUTS, STEP_INPUTS, Batch
from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.onnxruntime.buffers import OutputBuffers
from ingot.runtime.engines.onnxruntime.options import draft_session_options, engine_session_options
from ingot.runtime.kv_pool import KVPool

__all__ = ["EagleLayerSession", "EngineSession", "open_draft_graph"]

# The pool's numpy dtype -> the pool inputs' ORT type (an fp8 pool is E4M3FN bytes: uint8).
_ORT_TYPES = {
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float16): "tensor(float16)",
    np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.uint8): "tensor(uint8)",
}


def open_draft_graph(path: Path | str, what: str, input: str, output: str) -> ort.InferenceSession:
    """A drafter's small stateless graph (Medusa heads, EAGLE-3 fc) with the drafter options,
    refused unless it has the `input` and `output` its wrapper feeds and reads."""
    session = ort.InferenceSession(
        str(path), draft_session_options(), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    if input not in inputs or output not in outputs:
        raise SessionError(
            f"{what}: expected input {input!r} and output {output!r}, got inputs "
            f"{sorted(inputs)} and outputs {sorted(outputs)}"
        )
    return session


class _PagedSession:
    """A graph with the paged-KV interface (docs/design.md section 4). The pool arrays are
    bound once as OrtValues that alias them, so the bound values see every write and no call
    ever copies the cache. A graph with a `kv_slots` input writes each call's K/V itself
    (`writes_pool`): its `{k,v}_pool_out_{l}` outputs are bound to the same arrays, so its
    ScatterND writes the pool in place. An older graph returns them as `new_{k,v}_{l}` and the
    runtime writes them (KVPool.write). Each call binds the step inputs that are new arrays
    (ORT reads a bound array in place, so one updated in place, as DecodeInputs does, stays
    bound) and any extra ones, and writes `outputs` into reused buffers (`OutputBuffers`),
    valid until the next call."""

    __slots__ = (
        "_session",
        "_binding",
        "_pool_values",
        "_outputs",
        "_inputs",
        "num_layers",
        "writes_pool",
        "_scratch",
        "_bound",
    )

    def __init__(
        self,
        graph_file: Path | str,
        pool: KVPool,
        options: ort.SessionOptions,
        *,
        what: str,
        required_inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> None:
        self._session = ort.InferenceSession(
            str(graph_file), options, providers=["CPUExecutionProvider"]
        )
        self.num_layers = pool.num_layers
        graph_inputs = {i.name for i in self._session.get_inputs()}
        self.writes_pool = "kv_slots" in graph_inputs
        self._scratch = pool.scratch_block if self.writes_pool else None
        kinds = [(layer, kind) for layer in range(pool.num_layers) for kind in ("k", "v")]
        pool_outputs = [f"{kind}_pool_out_{layer}" for layer, kind in kinds]
        new_kv = [f"new_{kind}_{layer}" for layer, kind in kinds]
        _check_interface(
            self._session,
            pool,
            what,
            [
                *(n for n in required_inputs if n not in LOCAL_INPUTS),
                *(["kv_slots"] if self.writes_pool else []),
                *(LOCAL_INPUTS if pool.local_layers else ()),  # the pool's local layers read
            ],
            [*outputs, *(pool_outputs if self.writes_pool else new_kv)],
        )
        # Engines exported before `logits_indices` existed return logits
        # for every position; EngineSession.run then picks the rows itself.
        self._inputs = [n for n in STEP_INPUTS if n in graph_inputs]
        self._binding = self._session.io_binding()
        self._pool_values = []  # keeps the OrtValues (and so the aliases) alive
        fixed: list[tuple[str, np.ndarray]] = []  # outputs bound to the pool arrays
        for layer, kind in kinds:
            name, array = f"{kind}_pool_{layer}", getattr(pool, kind)[layer]
            value = ort.OrtValue.ortvalue_from_numpy(array)
            if value.data_ptr() != array.ctypes.data:
                raise SessionError(f"{name}: binding copied the pool array; it must alias it")
            self._binding.bind_ortvalue_input(name, value)
            self._pool_values.append(value)
            if self.writes_pool:  # ScatterND's output is the pool itself: written in place
                fixed.append((f"{kind}_pool_out_{layer}", array))
        per_call = [*outputs, *([] if self.writes_pool else new_kv)]
        self._outputs = OutputBuffers(self._session, per_call, fixed)
        # The arrays each step input is bound to (held, so no other array can take one's id).
        self._bound: list[np.ndarray | None] = [None] * len(self._inputs)

    def _call(self, batch: Batch, **extra: np.ndarray) -> list[np.ndarray]:
        """Run on `batch` (and the `extra` inputs, contiguous): the output buffers, in the
        order of `outputs` then, for a graph that returns its K/V, each layer's new_k, new_v."""
        if (batch.kv_slots is not None) != self.writes_pool:
            layout = "for a graph that writes" if batch.kv_slots is not None else "without"
            raise SessionError(
                f"the batch was built {layout} the pool (build_inputs' scratch_block), this "
                f"graph {'writes' if self.writes_pool else 'returns'} its K/V"
            )
        bind = self._binding.bind_cpu_input
        for i, name in enumerate(self._inputs):
            array = getattr(batch, name)  # build_inputs makes them contiguous
            # ORT reads a bound numpy array in place: the same array again, updated in place
            # (DecodeInputs), needs no new binding.
            if array is not self._bound[i]:
                bind(name, array)
                self._bound[i] = array
        for name, array in extra.items():
            bind(name, array)
        s, q = batch.input_ids.shape
        arrays = self._outputs.bind(self._binding, S=s, Q=q, N=len(batch.logits_indices))
        self._session.run_with_iobinding(self._binding)
        return arrays

    def _pairs(self, kv: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer (new_k, new_v); none from a graph that writes the pool itself."""
        if self.writes_pool:
            return []
        return [(kv[2 * i], kv[2 * i + 1]) for i in range(self.num_layers)]

    @property
    def scratch_block(self) -> int | None:
        """What build_inputs' `scratch_block` must be for this session's graph: the pool's
        scratch block if the graph writes the pool, else None."""
        return self._scratch


class EngineSession(_PagedSession):
    """Runs the target's engine over the pool (see `_PagedSession` for the binding).

    With `hidden`, the graph's `hidden` output (the final-norm rows that `logits` is computed
    from) is bound too and read through `hidden` after each call: what Medusa heads draft from.
    With `aux`, its `aux_hidden` output (every row's EAGLE-3 features, the residual streams
    entering three layers) is bound and read through `aux_hidden`: what an EAGLE draft reads.
    """

    __slots__ = ("_with_hidden", "_hidden", "_with_aux", "_aux")

    def __init__(
        self,
        engine_file: Path | str,
        pool: KVPool,
        session_options: dict[str, Any] | None = None,
        profile_file_prefix: str | None = None,
        spinning: bool = True,
        hidden: bool = False,
        aux: bool = False,
    ) -> None:
        options = engine_session_options(session_options or {})
        if not spinning:
            # Threads that spin after a call take the cores from whatever else the process
            # runs meanwhile: a draft model's session (each keeps a thread pool), a server's
            # event loop.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if profile_file_prefix is not None:  # ORT's per-node profiler (benchmarks)
            options.enable_profiling = True
            options.profile_file_prefix = profile_file_prefix
        self._with_hidden, self._with_aux = hidden, aux
        self._hidden: np.ndarray | None = None
        self._aux: np.ndarray | None = None
        outputs = ["logits", *(["hidden"] if hidden else []), *(["aux_hidden"] if aux else [])]
        super().__init__(
            engine_file,
            pool,
            options,
            what="engine graph",
            required_inputs=[n for n in STEP_INPUTS if n not in ("logits_indices", "kv_slots")],
            outputs=outputs,
        )

    def run(self, batch: Batch) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """logits [N, V] float32 for the batch's `logits_indices` rows, and per layer
        (new_k, new_v) [S, Q, Hkv*D] (none when the graph wrote them into the pool itself).

        The arrays are the session's output buffers, valid until the next call: read them
        (sample, scatter the K/V) before running again.
        """
        logits, *kv = self._call(batch)
        if self._with_hidden:
            hidden, *kv = kv
        if self._with_aux:
            aux, *kv = kv
            self._aux = aux.reshape(-1, aux.shape[-1])  # [S*Q, 3Ht]: a view of the buffer
        if logits.ndim == 3:  # an engine without logits_indices: [S, Q, V]
            logits = logits.reshape(-1, logits.shape[-1])[batch.logits_indices]
        if self._with_hidden:
            if hidden.ndim == 3:  # [S, Q, H], as logits above
                hidden = hidden.reshape(-1, hidden.shape[-1])[batch.logits_indices]
            self._hidden = hidden  # [N, H]
        return logits, self._pairs(kv)

    @property
    def hidden(self) -> np.ndarray:
        """hidden [N, H] float32 of the last call: the final-norm rows its logits came from,
        in the same order. A session buffer like the logits, valid until the next call."""
        if self._hidden is None:
            why = "no call has run yet" if self._with_hidden else "opened without hidden=True"
            raise SessionError(f"no hidden rows: {why}")
        return self._hidden

    @property
    def aux_hidden(self) -> np.ndarray:
        """aux_hidden [S*Q, 3Ht] float32 of the last call: every row of the call (padding
        included), row s*Q + q for input_ids[s, q]. A session buffer, valid until the next
        call: copy what is kept."""
        if self._aux is None:
            why = "no call has run yet" if self._with_aux else "opened without aux=True"
            raise SessionError(f"no aux_hidden rows: {why}")
        return self._aux

    def end_profiling(self) -> str:
        """Stop ORT's profiler; the path of the JSON trace it wrote (see `profile_file_prefix`)."""
        return self._session.end_profiling()


class EagleLayerSession(_PagedSession):
    """An EAGLE-3 draft layer (draft/eagle/model.onnx): the paged-KV interface of one layer,
    plus a `hidden` [S, Q, H] input (each row's fc'd target features, or the previous step's
    draft_hidden), returning `draft_tokens` [N] int64 (greedy, target vocabulary ids) and
    `draft_hidden` [N, H] (the next step's `hidden`) for the `logits_indices` rows."""

    __slots__ = ()

    def __init__(self, graph_file: Path | str, pool: KVPool) -> None:
        super().__init__(
            graph_file,
            pool,
            draft_session_options(),
            what="EAGLE draft layer graph",
            required_inputs=[*(n for n in STEP_INPUTS if n != "kv_slots"), "hidden"],
            outputs=["draft_tokens", "draft_hidden"],
        )

    def run(
        self, batch: Batch, hidden: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """draft_tokens [N] int64, draft_hidden [N, H] float32 and per layer (new_k, new_v)
        [S, Q, Hkv*D] of `batch` with `hidden` [S, Q, H]: session buffers, valid until the
        next call (copy draft_hidden before feeding it back)."""
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        tokens, rows, *kv = self._call(batch, hidden=hidden)
        return tokens, rows, self._pairs(kv)


def _check_interface(
    session: ort.InferenceSession,
    pool: KVPool,
    what: str,
    required_inputs: Sequence[str],
    outputs: Sequence[str],
) -> None:
    """Every input and output the runtime binds is in the graph, the pool inputs of its type."""
    inputs = {i.name: i for i in session.get_inputs()}
    graph_outputs = {o.name for o in session.get_outputs()}
    pool_inputs = [f"{kv}_pool_{i}" for i in range(pool.num_layers) for kv in ("k", "v")]
    wanted = (*required_inputs, *pool_inputs)
    problems = [f"missing input {n!r}" for n in wanted if n not in inputs]
    problems += [f"missing output {n!r}" for n in outputs if n not in graph_outputs]
    expected = _ORT_TYPES.get(pool.dtype)
    for name in pool_inputs:
        if name in inputs and inputs[name].type != expected:
            problems.append(f"input {name!r} is {inputs[name].type}, the pool is {expected}")
    if problems:
        raise SessionError(f"{what} interface mismatch: " + "; ".join(problems))
