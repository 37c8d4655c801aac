"""The `artifact` section: the name and version of what the build produces, its signing, and a
chat template to ship with it."""

from __future__ import annotations

from pydantic import Field

from .base import _Strict

__all__ = ["Artifact", "ArtifactSign"]


class ArtifactSign(_Strict):
    """Sign the artifact when it is packaged (sigstore model_signing, key-based, offline)."""

    key: str = Field(
        min_length=1,
        description="PEM elliptic-curve private key (P-256/384/521); a relative path is "
        "resolved against the recipe's directory. An encrypted key's password is read from "
        "$INGOT_SIGNING_KEY_PASSWORD. manifest.json is signed into model.sig.",
    )


class Artifact(_Strict):
    """What the build produces."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$",
        description="Artifact name (lower case; used in paths and registry references).",
    )
    version: str = Field(
        default="0.1.0",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$",
        description="Artifact version (a valid OCI tag).",
    )
    sign: ArtifactSign | None = Field(
        default=None, description="Sign the artifact at package time (None: unsigned)."
    )
    portable: bool = Field(
        default=False,
        description="Ship the exported (portable) graph model.onnx(.data) beside the engines. "
        "Off by default: each weight is then held once, in the engine's file (an OpenVINO "
        "engine reads the onnxruntime engine's weights). An engine built from the graph at "
        "load with no onnxruntime engine beside it (OpenVINO alone) ships it whatever this says.",
    )
    chat_template: str | None = Field(
        default=None,
        min_length=1,
        description="A Jinja chat template file to bake into the artifact as "
        "chat_template.jinja, instead of the checkpoint's (or where it has none); a relative "
        "path is resolved against the recipe's directory. It must compile in the runtime's "
        "sandbox.",
    )
