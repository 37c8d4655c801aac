"""The builder: runs declared stages through the stage cache, in the order declared, and keeps
their outputs, timings and file digests for the steps after them.

Each stage's key is `stage_key(stage.kind, stage.key_slice, its inputs' digests, versions)`;
a hit is served from the cache (re-hashed: `StageCache.get`), a miss is produced into it
(`StageCache.put`), both under the key's lock (`StageCache.get_or_put`: builds sharing the
cache compute each stage once). Each run is recorded as a `StageRun` (time, peak RSS) and
reported through `on_stage(name, "start" | "cached" | "done")`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..cache import StageCache, stage_key
from ..stage_memory import StagePeak
from .stage import Part, Stage, StageJob, StageOutput

__all__ = ["StageRun", "Walk"]

T = TypeVar("T", bound=StageOutput)


@dataclass(slots=True)
class StageRun:
    stage: str
    key: str
    cached: bool
    seconds: float
    digest: str
    peak_rss_bytes: int | None = None  # the process's peak during the stage (stage_memory.py)


class Walk:
    """One build's walk over its stages."""

    def __init__(
        self,
        cache: StageCache,
        versions: dict[str, str],
        on_stage: Callable[[str, str], None] | None = None,
    ) -> None:
        self.cache, self.versions = cache, versions
        self.report = on_stage or (lambda stage, event: None)
        self.runs: list[StageRun] = []
        self.outputs: dict[str, StageOutput] = {}
        self.known_digests: dict[Path, str] = {}  # every stage file's sha256, as verified
        self._peak = StagePeak()

    def __getitem__(self, stage: Stage[T]) -> T:
        return self.outputs[stage.name]  # type: ignore[return-value]

    def run(self, stages: Iterable[Stage[Any]]) -> None:
        """Run `stages` in order: each after every stage it reads."""
        for stage in stages:
            self._run(stage)

    def key(self, stage: Stage[Any]) -> str:
        """The stage's cache key, its inputs resolved against the outputs so far."""
        digests = {name: self._digest(value) for name, value in stage.inputs.items()}
        return stage_key(stage.kind, stage.key_slice, digests, self.versions)

    def _digest(self, value: str | Stage[Any] | Part[Any]) -> str:
        if isinstance(value, Part):
            return value.digest(self[value.stage])
        if isinstance(value, Stage):
            return self[value].digest
        return value

    def _run(self, stage: Stage[Any]) -> None:
        if stage.name in self.outputs:
            raise ValueError(f"stage {stage.name} is declared twice")
        missing = [s.name for s in stage.upstream if s.name not in self.outputs]
        if missing:
            raise ValueError(f"stage {stage.name} reads {', '.join(missing)}, not run before it")
        key = self.key(stage)
        upstream = {s.name: self.outputs[s.name] for s in stage.upstream}

        def produce(out: Path, work: Path | None = None) -> None:
            stage.produce(StageJob(out, work, upstream))

        self.report(stage.name, "start")
        self._peak.start()
        started = time.perf_counter()
        path, hit = self.cache.get_or_put(stage.kind, key, produce, resumable=stage.resumable)
        output = stage.output(path, self.cache.digest(path))
        self.known_digests.update(self.cache.file_digests(path))
        self.outputs[stage.name] = output
        seconds = time.perf_counter() - started
        run = StageRun(stage.name, key, hit, seconds, output.digest, self._peak.peak())
        self.runs.append(run)
        self.report(stage.name, "cached" if hit else "done")

    def step(self, name: str, work: Callable[[], str]) -> str:
        """An uncached step after the stages (package): timed, reported and recorded like
        them, with no key; `work` returns its output's digest."""
        self.report(name, "start")
        self._peak.start()
        started = time.perf_counter()
        digest = work()
        seconds = time.perf_counter() - started
        self.runs.append(StageRun(name, "", False, seconds, digest, self._peak.peak()))
        self.report(name, "done")
        return digest
