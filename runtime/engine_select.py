"""Pick the first engine of a manifest this host can run, and say why the others were skipped."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ingot.artifacts import EngineInfo, Manifest

__all__ = [
    "TENSORRT_REQUIREMENTS",
    "HostInfo",
    "NoCompatibleEngine",
    "select_engine",
    "version_satisfies",
]

_SPEC = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*$")
_KNOWN_ORT_REQUIREMENTS = {"onnxruntime", "cpu_isa"}
# A TensorRT engine (a serialized plan) runs only with the TensorRT version that built it, a
# compatible CUDA runtime and the GPU architecture it was tuned for, so its manifest entry
# records all three, e.g. {"tensorrt": "==10.14.1", "cuda": ">=12.8", "compute_capability": "9.0"}.
TENSORRT_REQUIREMENTS = ("tensorrt", "cuda", "compute_capability")


class NoCompatibleEngine(RuntimeError):
    """No engine in the artifact can run on this host; `reasons` maps engine name -> why."""

    def __init__(self, reasons: dict[str, list[str]]) -> None:
        lines = "\n".join(f"  - {name}: {'; '.join(why)}" for name, why in reasons.items())
        super().__init__(f"no engine in this artifact can run on this host:\n{lines}")
        self.reasons = reasons


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What engine requirements are checked against."""

    onnxruntime_version: str | None
    cpu_flags: frozenset[str]
    tensorrt_problem: str | None  # why tensorrt engines cannot run here; None if they can

    @classmethod
    def detect(cls, probe_tensorrt: bool = True) -> HostInfo:
        """This host; `probe_tensorrt=False` skips importing tensorrt (slow, and GPU-only)."""
        try:
            import onnxruntime

            ort_version = onnxruntime.__version__
        except ImportError:
            ort_version = None
        trt = _tensorrt_problem() if probe_tensorrt else "tensorrt was not probed"
        return cls(ort_version, _cpu_flags(), trt)


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


def _tensorrt_problem() -> str | None:
    try:
        import tensorrt as trt
    except ImportError:
        return "tensorrt is not installed"
    try:
        trt.Builder(trt.Logger(trt.Logger.ERROR))  # raises without a usable GPU
    except Exception:
        return "no CUDA device"
    return "running tensorrt engines is not supported by this runtime yet"


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


def _onnxruntime_problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    problems = []
    if engine.device != "cpu":
        problems.append(f"device {engine.device!r}: this runtime runs onnxruntime on cpu only")
    requires = engine.requires
    unknown = sorted(set(requires) - _KNOWN_ORT_REQUIREMENTS)
    if unknown:
        problems.append(f"unknown requirements {unknown}")
    spec = requires.get("onnxruntime")
    if host.onnxruntime_version is None:
        problems.append("onnxruntime is not installed")
    elif spec is not None:
        try:
            if not version_satisfies(host.onnxruntime_version, spec):
                problems.append(f"needs onnxruntime {spec}, found {host.onnxruntime_version}")
        except ValueError as e:
            problems.append(str(e))
    missing = sorted(set(requires.get("cpu_isa", [])) - host.cpu_flags)
    if missing:
        problems.append(f"CPU lacks {', '.join(missing)}")
    return problems


def _tensorrt_problems(engine: EngineInfo, host: HostInfo) -> list[str]:
    if host.tensorrt_problem:
        return [host.tensorrt_problem]
    missing = [key for key in TENSORRT_REQUIREMENTS if key not in engine.requires]
    return [f"the manifest does not record {', '.join(missing)}"] if missing else []


def select_engine(manifest: Manifest, host: HostInfo | None = None) -> tuple[EngineInfo, list[str]]:
    """The first engine in `manifest.engines` this host can run, and one line per skipped one."""
    if host is None:
        host = HostInfo.detect(probe_tensorrt=any(e.engine == "tensorrt" for e in manifest.engines))
    skipped: dict[str, list[str]] = {}
    for engine in manifest.engines:
        if engine.engine == "onnxruntime":
            problems = _onnxruntime_problems(engine, host)
        elif engine.engine == "tensorrt":
            problems = _tensorrt_problems(engine, host)
        else:
            problems = [f"unknown engine kind {engine.engine!r}"]
        if not problems:
            return engine, [f"{name}: {'; '.join(why)}" for name, why in skipped.items()]
        skipped[engine.name] = problems
    raise NoCompatibleEngine(skipped)
