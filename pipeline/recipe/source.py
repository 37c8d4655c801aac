"""The `source` section: the checkpoint to build from, a local directory or a pinned Hub repo."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag

from .base import _Strict

__all__ = ["HubSource", "LocalSource", "Source"]


class LocalSource(_Strict):
    """A Hugging Face checkpoint directory on disk (config.json, *.safetensors, tokenizer)."""

    path: str = Field(
        min_length=1,
        description="Checkpoint directory; a relative path is resolved against the recipe's "
        "directory when the recipe is loaded.",
    )


class HubSource(_Strict):
    """A Hugging Face Hub repository, pinned to a revision. Remote code is never run."""

    hub: str = Field(
        pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$",
        description="Repository id, `org/name`.",
    )
    revision: str = Field(
        pattern=r"^[A-Za-z0-9][\w./-]{0,127}$",
        description="Commit sha (40 hex digits, preferred: it cannot move) or a tag / branch; "
        "ingot.lock records the sha it resolved to.",
    )


def _source_kind(value: Any) -> str | None:
    # Which union member to validate against is decided by which key is present; both or
    # neither is an error (None makes pydantic raise the custom error below).
    # Serializing hands us the model instead of the mapping.
    if isinstance(value, LocalSource | HubSource):
        return "path" if isinstance(value, LocalSource) else "hub"
    if not isinstance(value, dict):
        return None
    present = {"path", "hub"} & value.keys()
    return present.pop() if len(present) == 1 else None


Source = Annotated[
    Annotated[LocalSource, Tag("path")] | Annotated[HubSource, Tag("hub")],
    Discriminator(
        _source_kind,
        custom_error_type="source_kind",
        custom_error_message="needs exactly one of `path` (local checkpoint) "
        "or `hub` + `revision` (Hugging Face Hub)",
    ),
]
