"""Calibration data: a dataset -> documents -> one token stream -> `samples` windows of `seq_len`.

Where the data comes from (``calibration.dataset`` in a recipe):

- a local file or a directory of files, read through `datasets`: ``.txt`` (each file is one
  document), ``.jsonl`` / ``.json``, ``.parquet``, ``.arrow``;
- otherwise a Hugging Face Hub dataset id (``org/name``), loaded with ``load_dataset``.

A value that starts like a path (``/``, ``./``, ``../``, ``~``), has one of those extensions or
exists on disk is local (relative to the recipe file); so a missing local file is reported as
missing instead of being looked up on the Hub.

Packing is deterministic: each document is encoded with the checkpoint's tokenizer (its
post-processor adds BOS where the checkpoint uses one), followed by EOS unless it already ends
with it; the documents are concatenated in dataset order and cut into non-overlapping windows of
``seq_len``; ``samples`` windows are drawn without replacement by ``numpy``'s seeded PCG64 and
sorted. Windows never overlap and are never repeated: data with fewer than
``samples * seq_len`` tokens is refused (repeating text would silently weight it twice in the
Hessians and activation statistics). A text field that holds chat messages
(``[{role, content}, ...]``) is rendered with the checkpoint's chat template first.

The dataset digest is the sha256 of the data files, so it goes into ``ingot.lock`` together
with the chosen window indices.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from ingot.artifacts.digest import sha256_file
from ingot.common.errors import IngotError
from ingot.runtime.tokenizer import TextTokenizer

__all__ = [
    "DATA_EXTENSIONS",
    "CalibrationError",
    "CalibrationSet",
    "RenderedChat",
    "DatasetFiles",
    "is_local_dataset",
    "load_calibration",
    "pack_documents",
    "read_documents",
    "resolve_dataset",
    "select_windows",
]

# Extension -> the `datasets` packaged builder that reads it.
DATA_EXTENSIONS = {
    ".txt": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
_TOKENS_FILE = "tokens.safetensors"
_META_FILE = "calibration.json"


class CalibrationError(IngotError, ValueError):
    """The calibration data cannot be read, or is too small for the recipe."""


class RenderedChat(str):
    """A document rendered from chat messages: the template wrote the special tokens."""


def is_local_dataset(dataset: str, base: Path | None = None) -> bool:
    """True when ``dataset`` names local files (see the module docstring), not a Hub id."""
    if dataset.startswith(("/", "./", "../", "~")):
        return True
    path = Path(os.path.expanduser(dataset))
    if base is not None and not path.is_absolute():
        path = base / path
    return path.suffix.lower() in DATA_EXTENSIONS or path.exists()


@dataclass(frozen=True, slots=True)
class DatasetFiles:
    """A resolved dataset: its local files (none for a Hub dataset) and their digest."""

    dataset: str
    files: tuple[Path, ...]
    digests: dict[str, str]  # file name (relative to the dataset) -> sha256
    digest: str

    @property
    def local(self) -> bool:
        return bool(self.files)


def resolve_dataset(dataset: str) -> DatasetFiles:
    """The files of a local dataset and their digest; a Hub dataset is digested after loading."""
    if not is_local_dataset(dataset):
        return DatasetFiles(dataset, (), {}, "")
    path = Path(os.path.expanduser(dataset))
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_EXTENSIONS
        )
        if not files:
            known = ", ".join(DATA_EXTENSIONS)
            raise CalibrationError(f"calibration.dataset: {path} holds no data files ({known})")
        names = [f.relative_to(path).as_posix() for f in files]
    elif path.is_file():
        if path.suffix.lower() not in DATA_EXTENSIONS:
            known = ", ".join(DATA_EXTENSIONS)
            raise CalibrationError(
                f"calibration.dataset: {path}: unknown file type {path.suffix!r} (known: {known})"
            )
        files, names = [path], [path.name]
    else:
        raise CalibrationError(f"calibration.dataset: {path}: no such file or directory")
    kinds = {DATA_EXTENSIONS[f.suffix.lower()] for f in files}
    if len(kinds) > 1:
        raise CalibrationError(
            f"calibration.dataset: {path} mixes file types ({', '.join(sorted(kinds))})"
        )
    try:
        digests = {name: sha256_file(f) for name, f in zip(names, files, strict=True)}
    except OSError as e:
        raise CalibrationError(f"calibration.dataset: {e.filename}: cannot read ({e})") from e
    return DatasetFiles(dataset, tuple(files), digests, _combined_digest(digests))


def _combined_digest(digests: dict[str, str]) -> str:
    if len(digests) == 1:  # one file: its own sha256, so `sha256sum` can confirm it
        return "sha256:" + next(iter(digests.values()))
    blob = json.dumps(digests, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def read_documents(
    source: DatasetFiles, split: str, text_field: str, render_chat=None
) -> tuple[list[str], DatasetFiles]:
    """The documents of ``split``, in dataset order, and the source with its digest filled in
    (a Hub dataset is digested from the files `datasets` downloaded).

    ``render_chat(messages) -> str`` renders a field of chat messages; None refuses them.
    """
    import datasets  # heavy (pyarrow, fsspec): loads only when a dataset is read

    datasets.disable_progress_bars()
    where = str(source.files[0]) if len(source.files) == 1 else source.dataset
    with tempfile.TemporaryDirectory(prefix="ingot-calib-") as cache_dir:
        try:
            if source.local:
                builder = DATA_EXTENSIONS[source.files[0].suffix.lower()]
                extra = {"sample_by": "document"} if builder == "text" else {}
                data = datasets.load_dataset(
                    builder,
                    data_files={split: [str(f) for f in source.files]},
                    split=split,
                    cache_dir=cache_dir,
                    **extra,
                )
            else:
                data = datasets.load_dataset(source.dataset, split=split)
                source = _digest_hub_files(source, data)
        except Exception as e:  # noqa: BLE001 - every reader failure means the same to the user
            raise CalibrationError(f"calibration.dataset: {where}: cannot read ({e})") from e
        if text_field not in data.column_names:
            columns = ", ".join(data.column_names)
            raise CalibrationError(
                f"calibration.text_field: {where} has no field {text_field!r} (fields: {columns})"
            )
        documents = [_as_text(value, where, text_field, render_chat) for value in data[text_field]]
    return documents, source


def _digest_hub_files(source: DatasetFiles, data: Any) -> DatasetFiles:
    files = [Path(f["filename"]) for f in data.cache_files]
    digests = {f.name: sha256_file(f) for f in files}
    return DatasetFiles(source.dataset, (), digests, _combined_digest(digests))


def _as_text(value: Any, where: str, field: str, render_chat) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        if render_chat is None:
            raise CalibrationError(
                f"calibration.text_field: {where}: {field!r} holds chat messages but the "
                "checkpoint has no chat template"
            )
        return RenderedChat(render_chat(value))
    raise CalibrationError(
        f"calibration.text_field: {where}: {field!r} holds {type(value).__name__}, "
        "expected text or chat messages"
    )


def pack_documents(documents: list[str], encode, eos_token_id: int | None) -> np.ndarray:
    """One int64 token stream: each document encoded, then EOS unless it already ends with it."""
    pieces = []
    for doc in documents:
        ids = list(encode(doc))
        if eos_token_id is not None and (not ids or ids[-1] != eos_token_id):
            ids.append(eos_token_id)
        pieces.append(np.asarray(ids, dtype=np.int64))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def select_windows(
    stream: np.ndarray, samples: int, seq_len: int, seed: int, *, where: str = "dataset"
) -> tuple[list[int], np.ndarray]:
    """(sorted window indices, tokens [samples, seq_len]) drawn from the stream's windows."""
    windows = len(stream) // seq_len
    if windows < samples:
        raise CalibrationError(
            f"calibration.dataset: {where} packs into {len(stream)} tokens = {windows} windows "
            f"of {seq_len}; calibration needs samples x seq_len = {samples} x {seq_len} = "
            f"{samples * seq_len} tokens (windows never overlap): lower calibration.samples or "
            "calibration.seq_len, or add data"
        )
    rng = np.random.default_rng(seed)
    indices = sorted(int(i) for i in rng.choice(windows, size=samples, replace=False))
    tokens = stream[: windows * seq_len].reshape(windows, seq_len)[indices]
    return indices, np.ascontiguousarray(tokens)


@dataclass(frozen=True, slots=True)
class CalibrationSet:
    """The token windows the calibrated quantizers run through the model."""

    tokens: np.ndarray  # [N, T] int64
    indices: list[int]  # which windows of the packed stream, sorted
    dataset_digest: str
    windows: int = 0  # windows the stream held
    files: dict[str, str] | None = None  # data file -> sha256

    def lock_entry(self, calibration: dict[str, Any]) -> dict[str, Any]:
        """What ``ingot.lock`` records: the recipe's settings, the data digests, the indices."""
        return {
            **calibration,  # as the recipe wrote it (a local path stays relative to the recipe)
            "dataset_digest": self.dataset_digest,
            "files": self.files or {},
            "windows": self.windows,
            "indices": list(self.indices),
        }

    def save(self, out: Path) -> None:
        save_file({"tokens": self.tokens}, str(out / _TOKENS_FILE))
        meta = {
            "indices": self.indices,
            "dataset_digest": self.dataset_digest,
            "windows": self.windows,
            "files": self.files,
        }
        (out / _META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> CalibrationSet:
        meta = json.loads((path / _META_FILE).read_text())
        tokens = load_file(str(path / _TOKENS_FILE))["tokens"]
        return cls(tokens, meta["indices"], meta["dataset_digest"], meta["windows"], meta["files"])


def load_calibration(
    calibration: dict[str, Any],
    tokenizer_file: Path,
    *,
    eos_token_id: int | None,
    chat_template: str | None = None,
    special_tokens: tuple[str | None, str | None] = (None, None),
) -> CalibrationSet:
    """Read, tokenize, pack and select: the recipe's ``calibration`` section -> token windows.

    Raises CalibrationError naming the file for unreadable or too-small data; this runs before
    any model work, so a bad dataset costs seconds.
    """
    source = resolve_dataset(calibration["dataset"])
    tokenizer = TextTokenizer(tokenizer_file, chat_template, *special_tokens)

    def render_chat(messages: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=False)

    documents, source = read_documents(
        source,
        calibration["split"],
        calibration["text_field"],
        render_chat if tokenizer.has_chat_template else None,
    )

    def encode(text: str) -> list[int]:
        # A rendered chat template writes its own BOS; plain text gets the tokenizer's.
        return tokenizer.encode(text, add_special_tokens=not isinstance(text, RenderedChat))

    stream = pack_documents(documents, encode, eos_token_id)
    where = str(source.files[0]) if len(source.files) == 1 else source.dataset
    indices, tokens = select_windows(
        stream, calibration["samples"], calibration["seq_len"], calibration["seed"], where=where
    )
    windows = len(stream) // calibration["seq_len"]
    return CalibrationSet(tokens, indices, source.digest, windows, source.digests or None)
