"""Stage: load the source checkpoint into the IR, quantize it, save the IR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..model.load import load_model
from ..quantize.apply import quantize_model
from ..quantize.checkpoint import save_ir

__all__ = ["run_quantize"]


def run_quantize(source_path: Path, specs: list[dict[str, Any]], out: Path) -> None:
    model = load_model(source_path)
    summaries = quantize_model(model, specs)
    save_ir(model, out)
    (out / "quantize.json").write_text(json.dumps(summaries, indent=2, sort_keys=True) + "\n")
