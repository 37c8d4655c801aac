"""Whether a host can run an ONNX Runtime CPU engine: its record's ``requires`` against the
installed onnxruntime and the CPU's instruction-set flags."""

from __future__ import annotations

from ingot.artifacts import EngineInfo
from ingot.runtime.engines.base import HostInfo
from ingot.runtime.engines.requirements import cpu_library_problems

__all__ = ["REQUIREMENTS", "problems"]

REQUIREMENTS = {"onnxruntime", "cpu_isa"}  # what a record's `requires` may hold


def problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    """Why ``engine`` cannot run on ``host`` (none: it can)."""
    return cpu_library_problems(engine, host, "onnxruntime", REQUIREMENTS)
