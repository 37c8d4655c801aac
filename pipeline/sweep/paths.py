"""A recipe's file paths made absolute, so a variant written elsewhere (DIR/recipes/,
DIR/picked.yaml) builds what the base recipe named.

A recipe names its files relative to itself; the places that resolve them: the source and a
draft model's (recipe/load.py), Medusa / EAGLE-3 heads (heads/attach.py), the signing key
(stages/prepare.py), the chat template (chat_template.py), and the local datasets of
calibration (stages/calibrate.py) and evaluation (evaluate/windows.py, speculative.py).
Absolute rather than relative to the new file: the calibration and evaluation stage keys hold
the dataset as written, so one spelling for every variant and for picked.yaml lets them share
the stage cache, and picked.yaml then builds the very artifact the sweep measured.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ingot.calibration.dataset import is_local_dataset

__all__ = ["absolute_paths"]

_FILES = (
    ("source", "path"),
    ("speculative", "draft", "source", "path"),
    ("speculative", "heads", "attach"),
    ("artifact", "sign", "key"),
    ("artifact", "chat_template"),
)
_DATASETS = (
    ("calibration", "dataset"),
    ("evaluate", "perplexity", "dataset"),
    ("evaluate", "speculative", "dataset"),
)


def absolute_paths(data: dict[str, Any], base_dir: Path) -> None:
    """Rewrite the recipe mapping `data`'s relative file paths (and local datasets; a Hub id
    stays) as absolute paths against `base_dir`, the directory they were relative to."""
    for fields in _FILES + _DATASETS:
        parent = _get(data, fields[:-1])
        value = parent.get(fields[-1]) if isinstance(parent, dict) else None
        if not isinstance(value, str):
            continue
        if fields in _DATASETS and not is_local_dataset(value, base_dir):
            continue
        path = Path(os.path.expanduser(value))
        parent[fields[-1]] = os.path.normpath(base_dir / path)  # an absolute path stays


def _get(data: Any, fields: tuple[str, ...]) -> Any:
    for field in fields:
        data = data.get(field) if isinstance(data, dict) else None
    return data
