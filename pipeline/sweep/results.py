"""DIR/sweep.json: one object per variant with exactly the issue's fields, in the axes'
order, and what the numbers were measured on (the base recipe, the axes, the speed settings
and the host's load record)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import SweepError

__all__ = ["SWEEP_JSON", "Row", "read_sweep", "write_sweep"]

SWEEP_JSON = "sweep.json"


@dataclass(slots=True)
class Row:
    name: str
    recipe: str  # the variant's full recipe, relative to DIR (recipes/<name>.yaml)
    kl: float | None = None
    perplexity: float | None = None
    perplexity_ood: float | None = None
    artifact_bytes: int | None = None
    tok_s_batch1: float | None = None
    tok_s_batch32: float | None = None
    ttft_ms_p50: float | None = None
    build_s: float | None = None
    peak_build_bytes: int | None = None
    pareto: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_sweep(out: Path, rows: list[Row], about: dict[str, Any]) -> Path:
    """DIR/sweep.json: `about` (what was swept and how) and `variants` (the rows)."""
    path = out / SWEEP_JSON
    data = {**about, "variants": [r.to_json() for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_sweep(out: Path) -> tuple[list[Row], dict[str, Any]]:
    """The rows and the rest of DIR/sweep.json; SweepError when there is none."""
    path = out / SWEEP_JSON
    try:
        data = json.loads(path.read_text())
        rows = [Row(**v) for v in data.pop("variants")]
    except FileNotFoundError:
        raise SweepError(
            f"{path}: no such file: run the sweep first (--recipe and --axes)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SweepError(f"{path}: not a sweep result ({e})") from None
    return rows, data
