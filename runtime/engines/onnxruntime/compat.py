"""Whether a host can run an ONNX Runtime CPU engine: its record's ``requires`` against the
installed onnxruntime and the CPU's instruction-set flags."""

from __future__ import annotations

from ingot.artifacts import EngineInfo
from ingot.runtime.engines.base import HostInfo, version_satisfies

__all__ = ["REQUIREMENTS", "problems"]

REQUIREMENTS = {"onnxruntime", "cpu_isa"}  # what a record's `requires` may hold


def problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    """Why ``engine`` cannot run on ``host`` (none: it can)."""
    found = []
    if engine.device != "cpu":
        found.append(f"device {engine.device!r}: this runtime runs onnxruntime on cpu only")
    requires = engine.requires
    unknown = sorted(set(requires) - REQUIREMENTS)
    if unknown:
        found.append(f"unknown requirements {unknown}")
    spec = requires.get("onnxruntime")
    installed = host.libraries.get("onnxruntime")
    if installed is None:
        found.append("onnxruntime is not installed")
    elif spec is not None:
        try:
            if not version_satisfies(installed, spec):
                found.append(f"needs onnxruntime {spec}, found {installed}")
        except ValueError as e:
            found.append(str(e))
    missing = sorted(set(requires.get("cpu_isa", [])) - host.cpu_flags)
    if missing:
        found.append(f"CPU lacks {', '.join(missing)}")
    return found
