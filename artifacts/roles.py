"""Which files of an artifact a pull target needs, by the role each file has in the manifest.

Roles (manifest.FileEntry.role): `common` (config, tokenizer, chat template, lock: every target),
`portable` (the exported graph and its data), `engine:<name>` (engines/<name>/), `draft` (Medusa
heads, an EAGLE-3 draft, a draft graph built into an engine at load), `draft:<engine name>` (a
draft model's engine), `eval` (eval/), `interop:<format>` (interop/<format>/).

An engine needs `common`, its own `engine:<name>`, the roles its record `reads` (the openvino
engine rebuilds its model from the portable graph), the role of the file its `path` names (so a
record written before `reads` existed still gets its file), and the draft files it runs with:
`draft:<name>`, the role of its draft engine's `path`, and `draft` with Medusa heads or an
EAGLE draft.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.manifest import EngineInfo, FileEntry, Manifest

__all__ = ["check_roles", "engine_roles", "files_with_roles", "target_engine"]


def target_engine(manifest: Manifest, target: str) -> EngineInfo:
    """The engine `target` names: by name, else the first of that kind in the manifest's order."""
    for engine in manifest.engines:
        if engine.name == target:
            return engine
    for engine in manifest.engines:
        if engine.engine == target:
            return engine
    listed = ", ".join(f"{e.name} ({e.engine})" for e in manifest.engines)
    raise ArtifactError(f"target {target!r}: this artifact has no such engine (it has: {listed})")


def engine_roles(manifest: Manifest, engine: EngineInfo) -> frozenset[str]:
    """The roles of every file `engine` reads when it runs (module docstring)."""
    roles = {"common", f"engine:{engine.name}", f"draft:{engine.name}", *engine.reads}
    spec = manifest.speculative
    if spec is not None and (spec.heads is not None or spec.eagle is not None):
        roles.add("draft")  # the heads or the EAGLE draft run beside any engine
    by_path = {f.path: f.role for f in manifest.files}
    draft_engines = spec.draft.engines if spec is not None and spec.draft is not None else []
    # The files the records name: an openvino draft's draft/model.onnx has role `draft`.
    paths = [engine.path] + [e.path for e in draft_engines if e.name == engine.name]
    roles |= {by_path[p] for p in paths if p in by_path}
    return frozenset(roles)


def check_roles(manifest: Manifest, roles: Iterable[str]) -> frozenset[str]:
    """`roles` as given (`ingot pull --role`), refused with one line if the manifest has none
    of a role's files and does not know the role."""
    roles = frozenset(roles)
    unknown = sorted(roles - manifest.known_roles() - {f.role for f in manifest.files})
    if unknown:
        present = sorted({f.role for f in manifest.files})
        raise ArtifactError(
            f"role {', '.join(unknown)}: not a role of this artifact (its files have: "
            f"{', '.join(present)})"
        )
    return roles


def files_with_roles(manifest: Manifest, roles: Collection[str] | None) -> list[FileEntry]:
    """The files of `roles` (None: every file), in the manifest's order."""
    return [f for f in manifest.files if roles is None or f.role in roles]
