"""Whether a host can run an OpenVINO CPU engine: its record's ``requires`` against the
installed openvino and the CPU's instruction-set flags, and its ``session_options`` against
what this runtime applies."""

from __future__ import annotations

from ingot.artifacts import EngineInfo
from ingot.runtime.engines.base import HostInfo, SessionError
from ingot.runtime.engines.openvino.options import CompileOptions
from ingot.runtime.engines.requirements import cpu_library_problems

__all__ = ["REQUIREMENTS", "problems"]

REQUIREMENTS = {"openvino", "cpu_isa"}  # what a record's `requires` may hold


def problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    """Why ``engine`` cannot run on ``host`` (none: it can)."""
    found = cpu_library_problems(engine, host, "openvino", REQUIREMENTS)
    try:
        CompileOptions.parse(engine.session_options)
    except SessionError as e:
        found.append(str(e))
    return found
