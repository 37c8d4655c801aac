"""ingot artifacts: the on-disk format of a compiled model and its verification.

The production runtime depends on it: imports ingot.common (of ingot), the standard library,
numpy and pydantic; requests and oras only in the registry modules (registry_client.py,
oci.py, loaded when a registry is named), model_signing only when signing or verifying a
signature.
"""

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.manifest import (
    FORMAT,
    FORMAT_VERSION,
    DraftInfo,
    EngineInfo,
    FileEntry,
    FileRef,
    GraphInfo,
    Manifest,
    ModelInfo,
    SpeculativeInfo,
    TensorSpec,
    TokenizerInfo,
    read_manifest,
    write_manifest,
)
from ingot.artifacts.paths import iter_artifact_files, safe_relative_path
from ingot.artifacts.verify import manifest_digest, verify_artifact

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ArtifactError",
    "DraftInfo",
    "EngineInfo",
    "FileEntry",
    "FileRef",
    "GraphInfo",
    "TensorSpec",
    "Manifest",
    "ModelInfo",
    "SpeculativeInfo",
    "TokenizerInfo",
    "iter_artifact_files",
    "manifest_digest",
    "read_manifest",
    "safe_relative_path",
    "sha256_bytes",
    "sha256_file",
    "verify_artifact",
    "write_manifest",
]
