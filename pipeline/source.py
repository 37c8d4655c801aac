"""Resolve a recipe's source to a local checkpoint directory with pinned file digests."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingot.artifacts.digest import sha256_file
from ingot.common.errors import IngotError

from .model.family import MODEL_FAMILIES
from .model.load import weight_files

__all__ = [
    "OFFLINE_HINT",
    "ResolvedSource",
    "SourceError",
    "check_architecture",
    "hub_cached_snapshot",
    "hub_file",
    "read_config_file",
    "resolve_source",
]

# What ingot reads from a checkpoint; nothing else (no *.py: remote code is never run).
_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
_HUB_PATTERNS = [*_FILES, "*.safetensors", "model.safetensors.index.json", "chat_template.jinja"]
OFFLINE_HINT = (
    "run once with network access to populate the cache, then set HF_HUB_OFFLINE=1; "
    "or point source.path at a local copy"
)


class SourceError(IngotError, ValueError):
    """The checkpoint cannot be used: missing files, remote code, unpinned hub revision."""


@dataclass(slots=True)
class ResolvedSource:
    path: Path
    revision: str | None  # hub commit sha, None for a local directory
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256

    @property
    def hf_config(self) -> dict:
        return read_config_json(self.path)

    def lock_entry(self, display: str) -> dict:
        return {"source": display, "revision": self.revision, "files": self.files}


def read_config_json(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict; unreadable or malformed JSON is a SourceError
    naming the file."""
    return read_config_file(checkpoint / "config.json")


def read_config_file(file: Path) -> dict[str, Any]:
    """A model config.json (any file name) as a dict; a SourceError names a bad file."""
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{file}: cannot read the model config ({e})") from e
    if not isinstance(config, dict):
        raise SourceError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def resolve_source(source: dict) -> ResolvedSource:
    """``source`` is the recipe's source slice: {"path": ...} or {"hub": ..., "revision": ...}."""
    if "hub" in source:
        path, revision = _download(source["hub"], source["revision"])
    else:
        path, revision = Path(source["path"]), None
    if not path.is_dir():
        raise SourceError(f"source.path: {path} is not a directory")
    for name in ("config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise SourceError(f"source.path: {path} has no {name}")
    config = read_config_json(path)
    check_architecture(config, path / "config.json")  # before the weights are hashed
    if "auto_map" in config:
        raise SourceError(
            f"{path / 'config.json'}: the checkpoint needs remote code (auto_map); "
            "ingot never runs code from a checkpoint"
        )
    try:
        weights = weight_files(path)
    except ValueError as e:
        raise SourceError(str(e)) from e
    names = [n for n in _FILES if (path / n).is_file()] + [w.name for w in weights]
    if (path / "model.safetensors.index.json").is_file():
        names.append("model.safetensors.index.json")
    return ResolvedSource(path, revision, {n: sha256_file(path / n) for n in sorted(names)})


def check_architecture(config: dict[str, Any], file: Path | str) -> None:
    """Raise SourceError (one line naming the architecture and those ingot takes) unless
    `config` (a config.json) is of a model family ingot takes (its model_type)."""
    model_type = config.get("model_type")
    if model_type in MODEL_FAMILIES:
        return
    names = config.get("architectures")
    named = names[0] if isinstance(names, list) and names else None
    what = f"{named} (model_type {model_type!r})" if named else f"model_type {model_type!r}"
    takes = ", ".join(f"{MODEL_FAMILIES.get(n).hf_class} ({n})" for n in MODEL_FAMILIES.names())
    raise SourceError(f"{file}: architecture {what} is not one ingot takes; it takes {takes}")


def _download(repo_id: str, revision: str) -> tuple[Path, str]:
    """Fetch only the safe files of a pinned hub revision (into the HF cache): config.json
    first, whose architecture is checked before anything else downloads.

    The revision is resolved to its commit first (one quick request, not retried); when the
    hub cannot be reached (no network, or HF_HUB_OFFLINE=1) the local HF cache is used if it
    holds a complete snapshot of that revision, else a SourceError says what to do.
    """
    hub = _hub()
    commit, unreachable = _resolve_commit(hub, repo_id, revision)
    if commit is not None:
        with _hub_errors(repo_id, revision):  # config.json alone first: a model ingot does
            config = Path(hub.hf_hub_download(repo_id, "config.json", revision=commit))
        check_architecture(read_config_file(config), f"{repo_id}@{commit[:12]}: config.json")
        with _hub_errors(repo_id, revision):  # not take fails before its weights download
            path = hub.snapshot_download(repo_id, revision=commit, allow_patterns=_HUB_PATTERNS)
        return Path(path), commit
    path = hub_cached_snapshot(repo_id, revision)
    if path is None:
        raise _unreachable_error(repo_id, revision, unreachable)
    return path, path.name  # snapshots/<commit>


def hub_file(repo_id: str, revision: str, filename: str, *, hint: str = OFFLINE_HINT) -> Path:
    """One file of a hub revision, from the hub or, when it cannot be reached, from the local
    HF cache; a SourceError (one line, ending in ``hint``) when neither has it."""
    hub = _hub()
    commit, unreachable = _resolve_commit(hub, repo_id, revision)
    if commit is not None:
        with _hub_errors(repo_id, revision):
            return Path(hub.hf_hub_download(repo_id, filename, revision=commit))
    try:
        file = hub.hf_hub_download(repo_id, filename, revision=revision, local_files_only=True)
    except FileNotFoundError:  # huggingface_hub's LocalEntryNotFoundError
        raise _unreachable_error(repo_id, revision, unreachable, hint=hint) from None
    return Path(file)


def hub_cached_snapshot(repo_id: str, revision: str) -> Path | None:
    """The local HF cache's snapshot of a hub revision (a commit, or a branch / tag through
    the cache's refs/), if it holds config.json, tokenizer.json and safetensors weights;
    never touches the network."""
    try:
        path = Path(
            _hub().snapshot_download(
                repo_id, revision=revision, allow_patterns=_HUB_PATTERNS, local_files_only=True
            )
        )
    except FileNotFoundError:  # LocalEntryNotFoundError, IncompleteSnapshotError
        return None
    complete = all((path / n).is_file() for n in ("config.json", "tokenizer.json"))
    return path if complete and any(path.glob("*.safetensors")) else None


def _hub():
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError as e:  # pragma: no cover - huggingface_hub comes with transformers
        raise SourceError("source.hub needs huggingface_hub (pip install 'ingot[build]')") from e


def _resolve_commit(hub, repo_id: str, revision: str) -> tuple[str | None, BaseException | None]:
    """(commit, None) from the hub, or (None, why) when the hub cannot be reached."""
    try:
        with _hub_errors(repo_id, revision, unreachable_too=False):
            return hub.HfApi().model_info(repo_id, revision=revision).sha, None
    except Exception as e:
        if _is_unreachable(e):
            return None, e
        raise


def _unreachable_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "no answer from the hub": no network, DNS, timeouts, proxies,
    HF_HUB_OFFLINE (huggingface_hub's OfflineModeIsEnabled is a ConnectionError)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("httpx2", ("TransportError",)),  # huggingface_hub >= 1.x
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),  # huggingface_hub < 1.0
    ):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    return tuple(found)


def _is_unreachable(error: BaseException) -> bool:
    if isinstance(error, _unreachable_types()):
        return True
    status = getattr(getattr(error, "response", None), "status_code", None)
    return isinstance(status, int) and status >= 500  # the hub is down: try the cache


def _unreachable_error(
    repo_id: str, revision: str, cause: BaseException | None, *, hint: str = OFFLINE_HINT
) -> SourceError:
    if type(cause).__name__ == "OfflineModeIsEnabled":
        why = "HF_HUB_OFFLINE is set"
    else:
        why = f"the Hugging Face Hub cannot be reached ({_one_line(cause)})"
    return SourceError(
        f"source.hub: {repo_id} at revision {revision}: {why} and the local Hugging Face "
        f"cache ({_hub_cache_dir()}) holds no complete copy of it: {hint}"
    )


@contextmanager
def _hub_errors(repo_id: str, revision: str, *, unreachable_too: bool = True) -> Iterator[None]:
    """What the hub answers, as a one-line SourceError; anything unrecognized propagates."""
    try:
        yield
    except SourceError:
        raise
    except Exception as e:
        unreachable = _is_unreachable(e) or isinstance(e, FileNotFoundError)
        if unreachable and unreachable_too:
            # lost mid-download, or huggingface_hub's own fallback to a cache without the files
            raise _unreachable_error(repo_id, revision, e) from e
        error = None if unreachable else _refused(repo_id, revision, e)
        if error is None:
            raise
        raise error from e


def _refused(repo_id: str, revision: str, error: Exception) -> SourceError | None:
    where = f"source.hub: {repo_id} at revision {revision}"
    kinds = {c.__name__ for c in type(error).__mro__}
    if "GatedRepoError" in kinds:
        return SourceError(
            f"{where}: a gated repository: accept its license on the hub, then log in "
            "(`hf auth login` or HF_TOKEN)"
        )
    if "RepositoryNotFoundError" in kinds:
        return SourceError(
            f"{where}: no such repository on the hub (or a private one: log in with "
            "`hf auth login` or HF_TOKEN)"
        )
    if "RevisionNotFoundError" in kinds:
        return SourceError(f"{where}: the repository has no revision {revision}")
    if isinstance(error, OSError) and hasattr(error, "response"):  # HfHubHTTPError
        return SourceError(f"{where}: the hub refused ({_one_line(error)})")
    return None


def _one_line(error: BaseException | None) -> str:
    if error is None:
        return "no answer"
    text = " ".join(str(error).split()) or "no message"
    return f"{type(error).__name__}: {text[:200]}"


def _hub_cache_dir() -> str:
    try:
        return str(importlib.import_module("huggingface_hub.constants").HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"
