"""The evaluation text: a local file or a Hub dataset, read once, identified by its digest.

Local versus Hub follows the calibration data's rule (`calibration.dataset.is_local_dataset`);
local paths are relative to the recipe file, like the source checkpoint. Plain .txt (one
document) and .jsonl files are read directly; other formats and Hub ids go through `datasets`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ingot.calibration.dataset import is_local_dataset

from .errors import EvalDataError

__all__ = ["EvalText", "load_eval_text"]

_DOC_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class EvalText:
    text: str
    sha256: str  # of the UTF-8 text actually evaluated: the stage's dataset digest


def load_eval_text(
    dataset: str,
    *,
    text_field: str = "text",
    split: str = "train",
    base_dir: Path | None = None,
    where: str = "evaluate.perplexity",
) -> EvalText:
    """The documents of `dataset` joined by blank lines; ValueError if unreadable or empty.
    Errors name the fields under `where` (the recipe section that asked for the text)."""
    if is_local_dataset(dataset, base_dir):
        path = Path(os.path.expanduser(dataset))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        docs = _local_documents(path, text_field, where)
    else:
        docs = _hub_documents(dataset, text_field, split, where)
    text = _DOC_SEPARATOR.join(d for d in docs if d)
    if not text.strip():
        raise EvalDataError(f"{where}.dataset: {dataset!r} holds no text")
    return EvalText(text, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest())


def _local_documents(path: Path, text_field: str, where: str) -> list[str]:
    if not path.is_file():
        raise EvalDataError(f"{where}.dataset: no such file: {path}")
    if path.suffix == ".txt":
        try:
            return [path.read_text(encoding="utf-8")]
        except UnicodeDecodeError as exc:
            raise EvalDataError(f"{where}.dataset: {path} is not UTF-8 text ({exc})") from None
    if path.suffix == ".jsonl":
        return [_field(json.loads(line), text_field, path, i, where) for i, line in _lines(path)]
    return _datasets_documents(path, text_field, where)


def _lines(path: Path):
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, line


def _field(record: object, text_field: str, path: Path, line: int, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise EvalDataError(f"{where}.text_field: {path}:{line} has no string field {text_field!r}")
    return record[text_field]


def _datasets_documents(path: Path, text_field: str, where: str) -> list[str]:
    # .json / .parquet / .arrow go through `datasets`, which knows their many layouts.
    loader = {".json": "json", ".parquet": "parquet", ".arrow": "arrow"}.get(path.suffix)
    if loader is None:
        raise EvalDataError(
            f"{where}.dataset: {path}: unknown file type {path.suffix!r} "
            "(known: .txt, .jsonl, .json, .parquet, .arrow)"
        )
    ds = _load_dataset(where, loader, data_files=str(path), split="train")
    return _column(ds, text_field, str(path), where)


def _hub_documents(dataset: str, text_field: str, split: str, where: str) -> list[str]:
    ds = _load_dataset(where, dataset, split=split)
    return _column(ds, text_field, dataset, where)


def _load_dataset(where: str, *args, **kwargs):
    try:
        import datasets  # optional, and seconds to import: only for the formats that need it
    except ImportError:
        raise EvalDataError(
            f"{where}.dataset: reading this dataset needs the `datasets` package "
            "(pip install datasets); plain .txt and .jsonl files do not"
        ) from None
    return datasets.load_dataset(*args, **kwargs)


def _column(ds, text_field: str, name: str, where: str) -> list[str]:
    if text_field not in ds.column_names:
        raise EvalDataError(
            f"{where}.text_field: {name} has no column {text_field!r} "
            f"(columns: {', '.join(ds.column_names)})"
        )
    return [t for t in ds[text_field] if isinstance(t, str)]
