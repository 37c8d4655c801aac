"""The serving plan (`ingot plan ARTIFACT --serve --memory 16GiB`): what `ingot serve` will hold
resident for an artifact's engine, and the KV cache a container's memory leaves for it.

Read from the manifest alone (no engine library is imported, nothing is loaded): the engine's
files, its KV layout and its resident-memory model, both from the engine kind's runtime
plug-in (engines/resident.py states the model). The KV cache is what the memory holds once the
weights, the engine's overhead and a margin are paid, in whole sequences of --max-seq-len
tokens; the plan's resident total is the container's memory request, --memory its limit:

    (weights + overhead + KV) x (1 + MARGIN) <= memory

MARGIN is the plan's stated accuracy (+-15% of the measured peak, benchmarks/serve/
serving_plan.py), so a plan that errs by that much still stays under the limit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ingot.artifacts import EngineInfo, Manifest
from ingot.common.errors import IngotError
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.resident import ServingShape
from ingot.runtime.memory import format_bytes

__all__ = [
    "MARGIN",
    "PlanDoesNotFit",
    "ServingPlan",
    "ServingRequest",
    "engine_file_bytes",
    "exact_size",
    "plan_serving",
    "planned_engine",
]

MARGIN = 0.15
_MIB = 1 << 20


class PlanDoesNotFit(IngotError, ValueError):
    """The memory given cannot hold the weights, the overhead and one sequence."""


@dataclass(frozen=True, slots=True)
class ServingRequest:
    """What the user asked the plan for (`ingot plan ARTIFACT --serve ...`)."""

    memory: int  # --memory: the container's memory limit
    max_seq_len: int | None = None  # None: the model's
    engine: str | None = None  # a name or kind; None: the artifact's first
    max_num_seqs: int | None = None  # at most this many sequences; None: as many as fit
    max_num_batched_tokens: int = 2048  # ingot serve's default


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """The plan's numbers, in bytes (`to_json`) and in words (`lines`)."""

    engine: str  # the engine's name (--engine)
    kind: str
    memory: int
    weight_files: int  # the bytes of the files the engine reads
    weights: int  # what it keeps resident of them
    overhead: int
    overhead_model: str
    kv_dtype: str
    kv_bytes_per_token: int
    kv_block_size: int
    max_seq_len: int
    sequences: int  # sequences of max_seq_len tokens the KV cache holds (--max-num-seqs)
    kv_cache_memory: int  # --kv-cache-memory
    kv_resident: int  # the pool's arrays: the cache and its scratch block
    max_num_batched_tokens: int

    @property
    def resident(self) -> int:
        return self.weights + self.overhead + self.kv_resident

    @property
    def memory_request(self) -> int:
        """The container's memory request: the resident total, in whole MiB."""
        return -(-self.resident // _MIB) * _MIB

    def serve_args(self) -> list[str]:
        """The `ingot serve` options this plan is for."""
        return [
            "--engine", self.engine,
            "--kv-cache-memory", exact_size(self.kv_cache_memory),
            "--max-num-seqs", str(self.sequences),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "resident": self.resident,
            "memory_request": self.memory_request,
            "memory_limit": self.memory,
            "margin": MARGIN,
            "serve_args": self.serve_args(),
        }

    def lines(self) -> list[str]:
        size = format_bytes
        return [
            f"engine {self.engine} ({self.kind})",
            f"  weights resident   {size(self.weights):>10}  (files {size(self.weight_files)})",
            f"  engine overhead    {size(self.overhead):>10}  ({self.overhead_model})",
            f"  KV cache           {size(self.kv_cache_memory):>10}  {self.kv_bytes_per_token} "
            f"bytes/token ({self.kv_dtype}, blocks of {self.kv_block_size}): "
            f"{self.sequences} sequences of {self.max_seq_len} tokens",
            f"  resident total     {size(self.resident):>10}  (+{MARGIN:.0%} margin <= "
            f"--memory {size(self.memory)}; for sequences up to {self.max_seq_len} tokens)",
            "serve with:",
            "  ingot serve ARTIFACT " + " ".join(self.serve_args()),
            f"container memory: request {self.memory_request // _MIB}Mi, limit "
            f"{self.memory // _MIB}Mi",
        ]


def plan_serving(manifest: Manifest, request: ServingRequest) -> ServingPlan:
    """The plan for serving `manifest`'s artifact as `request` asks; PlanDoesNotFit when the
    memory holds less than one sequence beside the weights."""
    engine = planned_engine(manifest, request.engine)
    runtime = ENGINE_RUNTIMES.get(engine.engine)
    model = manifest.model
    seq_len = request.max_seq_len or model.max_seq_len
    if seq_len > model.max_seq_len:
        raise PlanDoesNotFit(
            f"--max-seq-len {seq_len}: the model's max_seq_len is {model.max_seq_len}"
        )
    files = engine_file_bytes(manifest, engine)
    shape = ServingShape(model, files, request.max_num_batched_tokens, seq_len)
    if not hasattr(runtime, "resident_memory"):  # a plug-in written before the method
        raise PlanDoesNotFit(
            f"the {engine.engine} runtime plug-in has no resident-memory model "
            "(EngineRuntime.resident_memory): its serving memory cannot be planned"
        )
    resident = runtime.resident_memory(engine, shape)
    layout = runtime.kv_layout(manifest.graph, engine)
    per_block, block = layout.bytes_per_block, layout.block_size
    per_seq = -(-seq_len // block) * per_block
    # the pool's arrays hold one block more than the cache: the scratch block
    fixed = resident.weights + resident.overhead + per_block
    room = int(request.memory / (1 + MARGIN)) - fixed
    sequences = max(0, room // per_seq)
    if request.max_num_seqs is not None:
        sequences = min(sequences, request.max_num_seqs)
    if sequences < 1:
        needs = int((fixed + per_seq) * (1 + MARGIN))
        raise PlanDoesNotFit(
            f"--memory {format_bytes(request.memory, sep='')} is too small for {engine.name}: "
            f"weights {format_bytes(resident.weights)} + engine overhead "
            f"{format_bytes(resident.overhead)} + one sequence of {seq_len} tokens "
            f"{format_bytes(per_seq)} + {MARGIN:.0%} margin need at least "
            f"{-(-needs // _MIB)}MiB"
        )
    kv = sequences * per_seq
    return ServingPlan(
        engine=engine.name,
        kind=engine.engine,
        memory=request.memory,
        weight_files=files,
        weights=resident.weights,
        overhead=resident.overhead,
        overhead_model=resident.model,
        kv_dtype=manifest.graph.kv_dtype,
        kv_bytes_per_token=per_block // block,
        kv_block_size=block,
        max_seq_len=seq_len,
        sequences=sequences,
        kv_cache_memory=kv,
        kv_resident=kv + per_block,
        max_num_batched_tokens=request.max_num_batched_tokens,
    )


def planned_engine(manifest: Manifest, requested: str | None) -> EngineInfo:
    """The engine a pod would run: the one named (by name or kind), else the artifact's first
    with a runtime plug-in. The host's own libraries are not asked: the plan is for the pod."""
    listed = ", ".join(f"{e.name} ({e.engine})" for e in manifest.engines)
    for engine in manifest.engines:
        if requested in (None, engine.name, engine.engine) and engine.engine in ENGINE_RUNTIMES:
            return engine
    if requested is None:
        raise PlanDoesNotFit(f"this runtime runs none of the artifact's engines ({listed})")
    raise PlanDoesNotFit(f"--engine {requested}: the artifact has no such engine ({listed})")


def engine_file_bytes(manifest: Manifest, engine: EngineInfo) -> int:
    """The bytes of the files `engine` builds its model from: its own role's
    (`engine:<name>`), the roles its record reads (openvino: `portable`) and that of the file
    its path names (a record written before `reads`); not `common`, drafts or evaluation."""
    named = {f.role for f in manifest.files if f.path == engine.path}
    roles = {f"engine:{engine.name}", *engine.reads, *named}
    return sum(f.size for f in manifest.files if f.role in roles)


def exact_size(n: int) -> str:
    """`n` bytes as `ingot serve` reads them back exactly: 256MiB where whole, else digits."""
    for unit, size in (("GiB", 1 << 30), ("MiB", _MIB), ("KiB", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)
