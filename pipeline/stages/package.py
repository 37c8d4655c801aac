"""Stage: assemble the artifact directory and its manifest, replacing the old one atomically.

Every file is copied with its SHA-256 taken on the way (`copy_file_sha256`): the manifest's
digests are those of the bytes written, and a multi-GB weights file is read once, not copied
and then read again to be hashed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ingot.artifacts import write_manifest
from ingot.artifacts.digest import copy_file_sha256, sha256_bytes

from ..chat_template import chat_template_of

__all__ = ["DRAFT_DIR", "run_package"]

# A draft model's engines: draft/engines/<name>/ (no portable graph of the draft is shipped:
# the runtime loads engines only, and the target's model.onnx is the portable one).
DRAFT_DIR = "draft/"


# {path inside the artifact: (size, sha256 hex)} of the files copied so far.
Written = dict[str, tuple[int, str]]


def _copy_tree(src: Path, dst: Path, root: Path, written: Written, *, with_json=False) -> None:
    # Stage bookkeeping (graph.json, engine.json, check.json) goes into the manifest, not the
    # artifact.
    for f in sorted(src.rglob("*")):
        if f.is_file() and not f.name.startswith(".") and (with_json or f.suffix != ".json"):
            _copy(f, dst / f.relative_to(src), root, written)


def _copy(src: Path, target: Path, root: Path, written: Written) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    written[target.relative_to(root).as_posix()] = copy_file_sha256(src, target)


def run_package(
    out: Path,
    *,
    source: Path,
    export_dir: Path,
    engine_dirs: dict[str, Path],
    lock: dict[str, Any],
    draft_engine_dirs: dict[str, Path] | None = None,
    manifest_fields: dict[str, Any],
    extra_dirs: dict[str, Path] | None = None,
    sign_key: Path | None = None,
    chat_template: str | None = None,
) -> tuple[Any, str]:
    """Write the artifact to a sibling temp dir, then swap it in: a failure keeps the old one.

    `chat_template` (the recipe's artifact.chat_template, read) is shipped instead of the
    checkpoint's template; `draft_engine_dirs` (a draft model's engine stages) go under
    draft/engines/."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    written: Written = {}
    try:
        _copy_tree(export_dir, tmp, tmp, written)  # model.onnx + model.onnx.data
        for name, engine_dir in engine_dirs.items():
            _copy_tree(engine_dir, tmp / "engines" / name, tmp, written)
        for name, engine_dir in (draft_engine_dirs or {}).items():
            _copy_tree(engine_dir, tmp / DRAFT_DIR / "engines" / name, tmp, written)
        for rel, stage_dir in (extra_dirs or {}).items():  # eval/, interop/<format>/: as is
            _copy_tree(stage_dir, tmp / rel, tmp, written, with_json=True)
        _copy(source / "tokenizer.json", tmp / "tokenizer.json", tmp, written)
        _copy(source / "config.json", tmp / "config.json", tmp, written)
        template = chat_template if chat_template is not None else chat_template_of(source)
        if template is not None:
            (tmp / "chat_template.jinja").write_text(template)
        fields = dict(manifest_fields)
        fields["tokenizer"] = {
            **fields["tokenizer"],
            "chat_template": "chat_template.jinja" if template is not None else None,
        }
        lock_bytes = (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode()
        (tmp / "ingot.lock").write_bytes(lock_bytes)
        fields["lock"] = {"path": "ingot.lock", "sha256": sha256_bytes(lock_bytes)}
        manifest, digest = write_manifest(tmp, fields, written=written)
        if sign_key is not None:  # manifest.json -> model.sig, before the artifact appears
            from ingot.artifacts.signing import sign_artifact

            sign_artifact(tmp, sign_key)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest, digest


def _swap_into_place(new: Path, out: Path) -> None:
    old = out.parent / f".old-{out.name}-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)
