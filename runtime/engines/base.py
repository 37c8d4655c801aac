"""What an engine's runtime half implements, and the host it is judged against.

An engine kind (a manifest's ``engines[].engine``) runs through one package under
runtime/engines/, registered by kind in `ENGINE_RUNTIMES` (engines/__init__.py); the package
defines `PLUGIN`, an `EngineRuntime`. Who calls it: engine selection (engine_select.py) asks
`problems` of each engine in the manifest's order; the loader (model.py `open_engine`) sizes
the pool from `kv_layout` and drives the session `open` returns. The build side of the same
engine (`ingot.pipeline.engines`) writes what `problems` reads (the record's ``requires``)
and what `open` applies (``session_options``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.common.errors import IngotError
from ingot.runtime.batch import Batch
from ingot.runtime.engines.resident import ResidentMemory, ServingShape
from ingot.runtime.kv_pool import KVLayout, KVPool

__all__ = [
    "EngineRunner",
    "EngineRuntime",
    "HostInfo",
    "SessionError",
    "SessionSettings",
    "version_satisfies",
]

_SPEC = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*$")


class SessionError(IngotError, RuntimeError):
    """The engine file does not have the graph interface the runtime binds."""


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What engine requirements are checked against: the CPU's instruction-set flags and the
    versions of the engine libraries the manifest's engines use (module name -> its
    ``__version__``, None when it is not installed)."""

    cpu_flags: frozenset[str]
    libraries: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def detect(cls, libraries: tuple[str, ...] = ()) -> HostInfo:
        """This host, with the versions of `libraries` (each imported to read it)."""
        return cls(_cpu_flags(), {name: _version(name) for name in libraries})


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except ImportError:
        return None


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    # x86 lists ISA extensions under "flags", ARM under "Features"; both are per core and
    # identical across cores on the hosts we target, so the first line is enough.
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def version_satisfies(version: str, spec: str) -> bool:
    """Whether `version` ("1.31.1", "1.32.0.dev0") satisfies `spec` (">=1.31,<2").

    Only the numeric release part is compared, padded with zeros (so 2.0 == 2).
    """
    have = _release(version)
    for clause in spec.split(","):
        match = _SPEC.match(clause)
        if match is None:
            raise ValueError(f"cannot parse version requirement {clause.strip()!r} in {spec!r}")
        op, want = match.group(1) or "==", _release(match.group(2))
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {
            ">=": a >= b,
            "<=": a <= b,
            ">": a > b,
            "<": a < b,
            "==": a == b,
            "!=": a != b,
        }[op]
        if not ok:
            return False
    return True


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"cannot parse version {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the loader asks of a session besides the engine's record."""

    hidden: bool = False  # also keep the last call's `hidden` rows (Medusa heads read them)
    aux: bool = False  # also keep its `aux_hidden` rows (an EAGLE-3 draft's features)
    # A draft model's session beside the target's: kept small (ORT: one thread, no spinning).
    drafting: bool = False
    spinning: bool = True  # False: the engine's threads sleep between calls
    # The model's attention window (ModelInfo.sliding_window), for an engine whose graph
    # applies it itself (OpenVINO's PagedAttention); ONNX Runtime's graphs read it from the mask.
    sliding_window: int | None = None
    profile_file_prefix: str | None = None  # the engine's own profiler, where it has one


class EngineRunner(Protocol):
    """A session the Generator drives (generate.py `ModelRunner`), over the pool it was opened
    with. `writes_pool`: its graph writes each call's K/V into the pool itself (batches are then
    built with `scratch_block`, the pool's); else it returns them and the runtime writes them.
    Opened with ``hidden`` / ``aux``, it also keeps the last call's `hidden` / `aux_hidden`
    rows (what Medusa heads / an EAGLE-3 draft read)."""

    writes_pool: bool

    @property
    def scratch_block(self) -> int | None: ...

    def run(self, batch: Batch) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]: ...


class EngineRuntime(Protocol):
    """The runtime side of one engine kind (see the module docstring for who calls what)."""

    kind: str  # the manifest's engines[].engine
    libraries: tuple[str, ...]  # modules whose versions `problems` reads from the host

    def problems(self, engine: EngineInfo, host: HostInfo) -> list[str]:
        """Why ``engine`` cannot run on ``host``, one reason each; none when it can."""
        ...

    def kv_layout(self, graph: GraphInfo, engine: EngineInfo) -> KVLayout:
        """The pool ``engine``'s session reads, for the graph interface it was built from."""
        ...

    def resident_memory(self, engine: EngineInfo, shape: ServingShape) -> ResidentMemory:
        """What a server running ``engine`` holds besides its KV pool (resident.py's model,
        with this kind's measured coefficients): the serving plan's weights and overhead."""
        ...

    def open(
        self, path: Path, engine: EngineInfo, pool: KVPool, settings: SessionSettings
    ) -> EngineRunner:
        """The engine file at ``path`` as a session bound to ``pool`` (built from
        `kv_layout`), as ``settings`` ask."""
        ...
