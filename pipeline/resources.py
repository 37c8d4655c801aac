"""What this machine has against what a build needs, named before any work.

The needs come from `ingot plan`'s estimate (`plan.Plan`): host RAM is the peak stage's
memory; GPU memory (only when the recipe calibrates on a CUDA device) is that stage's working
set; disk is what the build writes (stage cache entries, the artifact, the hub download of the
weights), summed per filesystem. The readings:

- host RAM: ``MemAvailable`` of /proc/meminfo, capped by the cgroup's memory limit minus its
  usage (cgroup v2 ``memory.max`` / ``memory.current``, or v1 ``memory.limit_in_bytes`` /
  ``memory.usage_in_bytes``; inactive page cache counts as free, as the kernel reclaims it);
- GPU memory: ``torch.cuda.mem_get_info()`` of the current device, or "no CUDA device";
- disk: ``shutil.disk_usage`` at the directory, or at its nearest existing parent.

`ingot plan` prints every line; `ingot build` refuses with one line (`ResourceError`) when a
need exceeds what is available, unless ``INGOT_SKIP_RESOURCE_CHECK=1``: the needs are
estimates. A reading this machine cannot give (no /proc) is reported as unknown and not held
against the build.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ingot.common.errors import IngotError
from ingot.runtime.memory import host_memory_available

from .device import resolve_device
from .plan import CONSTANTS, Plan, format_bytes

__all__ = [
    "SKIP_ENV",
    "DiskSpace",
    "Need",
    "ResourceCheck",
    "ResourceError",
    "calibration_device",
    "check_resources",
    "disk_free",
    "gpu_memory_available",
    "host_memory_available",
    "require_resources",
]

SKIP_ENV = "INGOT_SKIP_RESOURCE_CHECK"

_DISK_LABELS = {
    "stage_cache": "stage cache",
    "artifact": "artifact",
    "hub_download": "hub download",
}


class ResourceError(IngotError, RuntimeError):
    """The build needs more memory or disk than this machine has (a user error: one line)."""


class DiskSpace(NamedTuple):
    free: int
    device: int  # st_dev: directories on one filesystem share their free space
    path: Path  # the directory measured (the nearest existing one)


@dataclass(frozen=True, slots=True)
class Need:
    resource: str  # "host RAM", "GPU memory", "disk"
    needed: int
    available: int | None  # None: this machine cannot say
    at: str  # what needs it: a stage, or what is written ("stage cache + artifact")
    paths: tuple[str, ...] = ()  # disk: the directories written (on one filesystem)
    detail: str = ""  # where the reading comes from, or why there is none

    @property
    def fits(self) -> bool:
        return self.available is None or self.needed <= self.available

    @property
    def name(self) -> str:
        return f"disk at {', '.join(self.paths)}" if self.paths else self.resource

    def describe(self) -> str:
        """e.g. ``host RAM: needs 63.2 GiB at export, 22.9 GiB available``."""
        if self.resource == "disk":
            need = f"{self.name}: needs {format_bytes(self.needed)} for the {self.at}"
            have = "free space unknown" if self.available is None else "free"
        else:
            need = f"{self.name}: needs {format_bytes(self.needed)} at {self.at}"
            have = "unknown" if self.available is None else "available"
        if self.available is None:
            return f"{need}, {have}" + (f" ({self.detail})" if self.detail else "")
        if self.available == 0 and self.detail:
            return f"{need}, {self.detail}"
        amount = format_bytes(self.available)
        return f"{need}, {amount} {have}" + (f" ({self.detail})" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "paths": list(self.paths),
            "at": self.at,
            "needed_bytes": self.needed,
            "available_bytes": self.available,
            "fits": self.fits,
            "detail": self.detail,
        }


@dataclass(slots=True)
class ResourceCheck:
    needs: list[Need] = field(default_factory=list)

    @property
    def short(self) -> list[Need]:
        return [n for n in self.needs if not n.fits]

    @property
    def fits(self) -> bool:
        return not self.short

    def lines(self) -> list[str]:
        """One line per resource, the ones that run out marked."""
        return [
            n.describe() + ("" if n.fits else ": this build does not fit this machine")
            for n in self.needs
        ]

    def verdict(self) -> str:
        if self.fits:
            return "fits this machine (estimates)"
        names = list(dict.fromkeys(n.resource for n in self.short))
        verb = "runs" if len(names) == 1 else "run"
        return (
            f"this build does not fit this machine: {' and '.join(names)} {verb} out "
            f"({SKIP_ENV}=1 builds anyway)"
        )

    def to_json(self) -> dict[str, Any]:
        return {"fits": self.fits, "needs": [n.to_json() for n in self.needs]}


def calibration_device(recipe: Any) -> str | None:
    """The recipe's calibration device (``calibration.device``), auto resolved on this host
    (cuda or cpu), when it has one."""
    calibration = getattr(recipe, "calibration", None)
    device = getattr(calibration, "device", None)
    if device is None:
        return None
    # auto as this host resolves it; a GPU the recipe asks for stays asked for, so a host
    # without one is told that the GPU memory is what it lacks.
    return resolve_device("auto") if str(device) == "auto" else str(device)


def check_resources(
    plan: Plan,
    *,
    cache_dir: Path,
    out_dir: Path,
    hub_cache: Path | None = None,
    device: str | None = None,
) -> ResourceCheck:
    """Every need of ``plan`` against this machine. ``device``: the calibration device
    (``cuda``, ``cuda:1``: GPU memory is checked; anything else: not); ``hub_cache``: where a
    hub source's weights are downloaded (counted only when the plan has a download)."""
    check = ResourceCheck()
    peak = plan.peak
    ram, ram_detail = host_memory_available()
    check.needs.append(Need("host RAM", peak.peak_bytes, ram, peak.stage, detail=ram_detail))
    if device is not None and device.startswith("cuda"):
        check.needs.append(_gpu_need(plan))
    check.needs.extend(_disk_needs(plan, cache_dir, out_dir, hub_cache))
    return check


def require_resources(check: ResourceCheck) -> None:
    """Raise a one-line ResourceError naming what runs out, unless $INGOT_SKIP_RESOURCE_CHECK."""
    if check.fits or os.environ.get(SKIP_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return
    short = "; ".join(n.describe() for n in check.short)
    raise ResourceError(
        f"this build does not fit this machine: {short} (estimates, see `ingot plan`; "
        f"free the space or set {SKIP_ENV}=1 to build anyway)"
    )


def _gpu_need(plan: Plan) -> Need:
    # The calibrated quantize stage is what runs on the device (the target's, or a draft
    # model's when only the draft calibrates): its working set is that stage's peak without
    # the interpreter and libraries (CONSTANTS["runtime_baseline_bytes"]).
    quantize = [s for s in plan.stages if s.stage in ("quantize", "draft-quantize")]
    stage = max(quantize, key=lambda s: s.gpu_bytes, default=plan.peak)
    needed = stage.gpu_bytes or max(0, stage.peak_bytes - CONSTANTS["runtime_baseline_bytes"])
    free, detail = gpu_memory_available()
    return Need("GPU memory", needed, free, stage.stage, detail=detail)


def _disk_needs(plan: Plan, cache_dir: Path, out_dir: Path, hub_cache: Path | None) -> list[Need]:
    writes = [("stage_cache", cache_dir), ("artifact", out_dir)]
    if plan.disk.get("hub_download"):
        writes.append(("hub_download", hub_cache or _hub_cache_dir()))
    # filesystem -> (free bytes, what is written there, the directories)
    groups: dict[int, tuple[int, list[str], list[str]]] = {}
    for what, directory in writes:
        space = disk_free(Path(directory))
        _, whats, paths = groups.setdefault(space.device, (space.free, [], []))
        whats.append(what)
        if str(directory) not in paths:
            paths.append(str(directory))
    return [
        Need(
            "disk",
            sum(plan.disk.get(w, 0) for w in whats),
            free,
            " + ".join(_DISK_LABELS[w] for w in whats),
            paths=tuple(paths),
        )
        for free, whats, paths in groups.values()
    ]


def _hub_cache_dir() -> Path:
    try:
        # huggingface_hub comes with transformers, the build extra: optional here
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return Path("~/.cache/huggingface/hub").expanduser()
    return Path(constants.HF_HUB_CACHE)


# --- readings (module functions, so that tests can replace them) ---------------------------


def gpu_memory_available() -> tuple[int, str]:
    """(free bytes, detail) of the current CUDA device; (0, "no CUDA device") without one."""
    try:
        # torch is the build extra's; the readings must not need it
        import torch
    except ImportError:
        return 0, "no CUDA device (torch is not installed)"
    if not torch.cuda.is_available():
        return 0, "no CUDA device"
    free, _total = torch.cuda.mem_get_info()
    return int(free), f"free on {torch.cuda.get_device_name()}"


def disk_free(directory: Path) -> DiskSpace:
    """Free bytes where ``directory`` is, or will be created (its nearest existing parent)."""
    path = directory.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return DiskSpace(shutil.disk_usage(path).free, path.stat().st_dev, path)
