"""`calibration.device` on this host: where the calibrated stages compute, resolved before any
build work (the calibrate stage carries it to the quantize and export stages; `ingot plan` and
the build's resource check ask it which GPU the build needs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .recipe import RecipeError
from .recipe.errors import format_problem

__all__ = ["DeviceSettings", "resolve_device"]


@dataclass(frozen=True, slots=True)
class DeviceSettings:
    """Where the quantize stage computes (a resolved torch device: cpu, cuda, cuda:N) and
    where it keeps the activations between layers (cpu: memory up to the budget, then disk;
    disk: always disk)."""

    device: str = "cpu"
    offload: str = "cpu"


def resolve_device(spec: str, *, file: str | None = None) -> str:
    """``calibration.device`` on this host: auto -> cuda when torch.cuda.is_available(), else
    cpu; cpu, cuda and cuda:N as written, once this host is known to have them. Raises
    RecipeError (one line naming `calibration.device`) for a CUDA device the host lacks."""
    if spec == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if spec == "auto":
        return "cuda" if available else "cpu"
    if not available:
        what = "no CUDA device on this host (torch.cuda.is_available() is False)"
        raise RecipeError(
            [format_problem("calibration.device", what, spec, "auto, cpu", file=file)]
        )
    _, _, index = spec.partition(":")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        what = f"this host has {count} CUDA device{'s' if count != 1 else ''}"
        allowed = f"auto, cpu, cuda, cuda:0 .. cuda:{count - 1}"
        raise RecipeError([format_problem("calibration.device", what, spec, allowed, file=file)])
    return spec
