"""The requirements every CPU engine records, checked against the host: the engine library's
version (``requires[<library>]``, a version spec) and the CPU's instruction sets
(``requires["cpu_isa"]``). Each engine kind's `problems` (its compat.py) calls this with its
library and the keys its records may hold."""

from __future__ import annotations

from collections.abc import Collection

from ingot.artifacts import EngineInfo
from ingot.runtime.engines.base import HostInfo, version_satisfies

__all__ = ["cpu_library_problems"]


def cpu_library_problems(
    engine: EngineInfo, host: HostInfo, library: str, allowed: Collection[str]
) -> list[str]:
    """Why ``engine``, run on cpu by ``library`` (its module name), cannot run on ``host``:
    another device, requirement keys outside ``allowed``, the library missing or of a version
    outside ``requires[library]``, instruction sets of ``requires["cpu_isa"]`` the CPU lacks."""
    found = []
    if engine.device != "cpu":
        found.append(f"device {engine.device!r}: this runtime runs {library} on cpu only")
    requires = engine.requires
    unknown = sorted(set(requires) - set(allowed))
    if unknown:
        found.append(f"unknown requirements {unknown}")
    spec = requires.get(library)
    installed = host.libraries.get(library)
    if installed is None:
        found.append(f"{library} is not installed")
    elif spec is not None:
        try:
            if not version_satisfies(installed, spec):
                found.append(f"needs {library} {spec}, found {installed}")
        except ValueError as e:
            found.append(str(e))
    missing = sorted(set(requires.get("cpu_isa", [])) - host.cpu_flags)
    if missing:
        found.append(f"CPU lacks {', '.join(missing)}")
    return found
