"""Pick the first engine of a manifest this host can run, and say why the others were skipped.

Each engine's kind is judged by its runtime plug-in (`ENGINE_RUNTIMES`: its `problems` with
the record's ``requires`` against the host); a kind this runtime has no plug-in for is skipped,
naming the kinds it has.
"""

from __future__ import annotations

from ingot.artifacts import EngineInfo, Manifest
from ingot.common.errors import IngotError
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.base import HostInfo

__all__ = ["HostInfo", "NoCompatibleEngine", "select_engine"]


class NoCompatibleEngine(IngotError, RuntimeError):
    """No engine in the artifact can run on this host; `reasons` maps engine name -> why."""

    def __init__(self, reasons: dict[str, list[str]]) -> None:
        lines = "\n".join(f"  - {name}: {'; '.join(why)}" for name, why in reasons.items())
        super().__init__(f"no engine in this artifact can run on this host:\n{lines}")
        self.reasons = reasons


def select_engine(manifest: Manifest, host: HostInfo | None = None) -> tuple[EngineInfo, list[str]]:
    """The first engine in `manifest.engines` this host can run, and one line per skipped one.
    Without `host`, this host, with the versions of the libraries the engines' kinds read."""
    kinds = [e.engine for e in manifest.engines if e.engine in ENGINE_RUNTIMES]
    if host is None:
        libraries = (lib for kind in kinds for lib in ENGINE_RUNTIMES.get(kind).libraries)
        host = HostInfo.detect(tuple(dict.fromkeys(libraries)))
    skipped: dict[str, list[str]] = {}
    for engine in manifest.engines:
        problems = _problems(engine, host)
        if not problems:
            return engine, [f"{name}: {'; '.join(why)}" for name, why in skipped.items()]
        skipped[engine.name] = problems
    raise NoCompatibleEngine(skipped)


def _problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    if engine.engine not in ENGINE_RUNTIMES:
        known = ", ".join(ENGINE_RUNTIMES.names())
        return [f"this runtime cannot run {engine.engine} engines (it runs: {known})"]
    return ENGINE_RUNTIMES.get(engine.engine).problems(engine, host)
