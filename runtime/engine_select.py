"""Pick the engine of a manifest this host runs, and say why the others were skipped.

Without a request, the first engine in the manifest's order this host can run: the order is
the recipe's `targets` order, the recorded preference. With one (`ingot serve --engine`,
`LLM(engine=...)`), the engine of that name, or the first compatible one of that kind; an
unknown name or one that cannot run here is an `EngineUnavailable` naming the engines the
artifact has and why the asked one cannot run.

Each engine's kind is judged by its runtime plug-in (`ENGINE_RUNTIMES`: its `problems` with
the record's ``requires`` against the host); a kind this runtime has no plug-in for is skipped,
naming the kinds it has.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ingot.artifacts import EngineInfo, Manifest
from ingot.artifacts.roles import engine_roles, files_with_roles
from ingot.common.errors import IngotError
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.base import HostInfo

__all__ = [
    "EngineUnavailable",
    "HostInfo",
    "NoCompatibleEngine",
    "pull_roles",
    "select_engine",
]


class NoCompatibleEngine(IngotError, RuntimeError):
    """No engine in the artifact can run on this host; `reasons` maps engine name -> why."""

    def __init__(self, reasons: dict[str, list[str]]) -> None:
        lines = "\n".join(f"  - {name}: {'; '.join(why)}" for name, why in reasons.items())
        super().__init__(f"no engine in this artifact can run on this host:\n{lines}")
        self.reasons = reasons


class EngineUnavailable(IngotError, ValueError):
    """The engine asked for by name or kind is not in the artifact, or cannot run here."""


def select_engine(
    manifest: Manifest,
    host: HostInfo | None = None,
    requested: str | None = None,
    absent: Collection[str] = (),
) -> tuple[EngineInfo, list[str]]:
    """The engine to run (module docstring), and one line per engine skipped before it.
    Without `host`, this host, with the versions of the libraries the engines' kinds read.
    `absent`: files a partial pull left out; an engine that reads one is skipped."""
    if host is None:
        kinds = [e.engine for e in manifest.engines if e.engine in ENGINE_RUNTIMES]
        libraries = (lib for kind in kinds for lib in ENGINE_RUNTIMES.get(kind).libraries)
        host = HostInfo.detect(tuple(dict.fromkeys(libraries)))
    candidates = manifest.engines
    if requested is not None:
        candidates = [e for e in manifest.engines if requested in (e.name, e.engine)]
        if not candidates:
            raise EngineUnavailable(
                f"engine {requested!r}: this artifact has no engine of that name or kind "
                f"(it has: {_listed(manifest.engines)})"
            )
    skipped: dict[str, list[str]] = {}
    for engine in candidates:
        problems = _not_pulled(manifest, engine, absent) or _problems(engine, host)
        if not problems:
            return engine, [f"{name}: {'; '.join(why)}" for name, why in skipped.items()]
        skipped[engine.name] = problems
    if requested is not None:
        why = "; ".join(f"{name}: {'; '.join(reasons)}" for name, reasons in skipped.items())
        raise EngineUnavailable(
            f"engine {requested!r} cannot run on this host ({why}); this artifact has: "
            f"{_listed(manifest.engines)}"
        )
    raise NoCompatibleEngine(skipped)


def pull_roles(requested: str | None = None) -> Callable[[Manifest], frozenset[str]]:
    """What a pull for this host fetches of an artifact: the roles of the engine select_engine
    picks from its manifest (`requested` as `--engine`), before any other file is fetched."""
    return lambda manifest: engine_roles(manifest, select_engine(manifest, requested=requested)[0])


def _not_pulled(manifest: Manifest, engine: EngineInfo, absent: Collection[str]) -> list[str]:
    if not absent:
        return []
    needed = files_with_roles(manifest, engine_roles(manifest, engine))
    missing = [f.path for f in needed if f.path in absent]
    if not missing:
        return []
    return [f"not pulled ({len(missing)} of its files are absent, e.g. {missing[0]})"]


def _listed(engines: list[EngineInfo]) -> str:
    return ", ".join(f"{e.name} ({e.engine})" for e in engines)


def _problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    if engine.engine not in ENGINE_RUNTIMES:
        known = ", ".join(ENGINE_RUNTIMES.names())
        return [f"this runtime cannot run {engine.engine} engines (it runs: {known})"]
    return ENGINE_RUNTIMES.get(engine.engine).problems(engine, host)
