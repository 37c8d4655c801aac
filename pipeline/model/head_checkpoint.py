"""The files of a drafter checkpoint (Medusa heads, an EAGLE-3 draft): its config.json, and
its safetensors read under the names the module uses and checked against the module's own
state before it is loaded."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

__all__ = ["check_tensors", "read_config", "read_tensors"]


def read_config(file: Path, error: type[ValueError]) -> dict:
    """config.json as a dict; ``error`` naming the file when it is unreadable or not an
    object."""
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise error(f"{file}: not a readable JSON config ({e})") from None
    if not isinstance(raw, dict):
        raise error(f"{file}: not a JSON object")
    return raw


def read_tensors(
    path: Path, rename: Callable[[str], str], error: type[ValueError]
) -> dict[str, torch.Tensor]:
    """Every tensor of ``path``'s *.safetensors files, as stored, under ``rename(name)``;
    ``error`` naming the directory when there are none."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise error(f"{path}: no *.safetensors weights beside config.json")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensors[rename(name)] = f.get_tensor(name)
    return tensors


def check_tensors(
    path: Path,
    tensors: Mapping[str, torch.Tensor | None],
    expected: Mapping[str, torch.Tensor],
    layout: str,
    error: type[ValueError],
) -> None:
    """``error`` naming ``path`` and up to four tensors when one the module expects is missing
    or of another shape (``layout`` names the format expected)."""
    missing = [n for n in expected if tensors.get(n) is None]
    if missing:
        raise error(f"{path}: missing tensors {missing[:4]} ({layout})")
    wrong = [
        f"{n} {list(tensors[n].shape)} (expected {list(t.shape)})"
        for n, t in expected.items()
        if tensors[n].shape != t.shape
    ]
    if wrong:
        raise error(f"{path}: tensors of the wrong shape: {'; '.join(wrong[:4])}")
