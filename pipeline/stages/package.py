"""Stage: assemble the artifact directory and its manifest, replacing the old one atomically.

A stage output whose SHA-256 the build already holds (``known_digests``: the stage cache took
or verified them in this build, `StageCache.file_digests`) is copied in the kernel
(`shutil.copyfile`), not read into Python again; ~6x faster for a multi-GB weights file. Any
other file is copied with its SHA-256 taken on the way (`copy_file_sha256`), so nothing is
read twice. The manifest's digests are those of the bytes the stages wrote.

Why not hard links, which would write nothing: `onnx.load` refuses external data with more
than one link ("potential hardlink attack"), so a linked artifact would not open in onnx.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ingot.artifacts import write_manifest
from ingot.artifacts.digest import copy_file_sha256, sha256_bytes

from ..chat_template import chat_template_of

__all__ = ["DRAFT_DIR", "EAGLE_DIR", "HEADS_DIR", "run_package"]

# A draft model's engines: draft/engines/<name>/ (no portable graph of the draft is shipped:
# the runtime loads engines only, and the target's model.onnx is the portable one).
DRAFT_DIR = "draft/"
# Medusa heads: draft/heads/model.onnx(.data) (the heads stage's graph; its record goes into the
# manifest, the vLLM-layout copy stays in the stage cache).
HEADS_DIR = "draft/heads/"
_HEADS_FILES = ("model.onnx", "model.onnx.data")
# An EAGLE-3 draft: draft/eagle/model.onnx (the draft layer) and fc.onnx, each with its .data
# (the eagle stage's graphs; the speculators copy stays in the stage cache).
EAGLE_DIR = "draft/eagle/"
_EAGLE_FILES = ("model.onnx", "model.onnx.data", "fc.onnx", "fc.onnx.data")


# {path inside the artifact: (size, sha256 hex)} of the files copied so far.
Written = dict[str, tuple[int, str]]


class _Copier:
    """Copies files into the artifact at ``root``, recording (size, sha256) of each."""

    def __init__(self, root: Path, known_digests: Mapping[Path, str]) -> None:
        self.root, self.known = root, known_digests
        self.written: Written = {}

    def tree(self, src: Path, dst: Path, *, with_json: bool = False) -> None:
        # Stage bookkeeping (graph.json, engine.json, check.json) goes into the manifest, not
        # the artifact.
        for f in sorted(src.rglob("*")):
            if f.is_file() and not f.name.startswith(".") and (with_json or f.suffix != ".json"):
                self.file(f, dst / f.relative_to(src))

    def file(self, src: Path, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        known = self.known.get(src)
        if known is None:
            entry = copy_file_sha256(src, target)
        else:
            shutil.copyfile(src, target)
            entry = (target.stat().st_size, known)
        self.written[target.relative_to(self.root).as_posix()] = entry


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
    known_digests: Mapping[Path, str] | None = None,
    heads_dir: Path | None = None,
    eagle_dir: Path | None = None,
) -> tuple[Any, str]:
    """Write the artifact to a sibling temp dir, then swap it in: a failure keeps the old one.

    `chat_template` (the recipe's artifact.chat_template, read) is shipped instead of the
    checkpoint's template; `draft_engine_dirs` (a draft model's engine stages) go under
    draft/engines/; `heads_dir` (the Medusa heads stage) ships its graph under draft/heads/,
    `eagle_dir` (the EAGLE-3 stage) its two graphs under draft/eagle/;
    `known_digests` {stage file: sha256} are digests the build already holds (module
    docstring)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    copy = _Copier(tmp, known_digests or {})
    try:
        copy.tree(export_dir, tmp)  # model.onnx + model.onnx.data
        for name, engine_dir in engine_dirs.items():
            copy.tree(engine_dir, tmp / "engines" / name)
        for name, engine_dir in (draft_engine_dirs or {}).items():
            copy.tree(engine_dir, tmp / DRAFT_DIR / "engines" / name)
        if heads_dir is not None:
            for name in _HEADS_FILES:
                copy.file(heads_dir / name, tmp / HEADS_DIR / name)
        if eagle_dir is not None:
            for name in _EAGLE_FILES:
                copy.file(eagle_dir / name, tmp / EAGLE_DIR / name)
        for rel, stage_dir in (extra_dirs or {}).items():  # eval/, interop/<format>/: as is
            copy.tree(stage_dir, tmp / rel, with_json=True)
        copy.file(source / "tokenizer.json", tmp / "tokenizer.json")
        copy.file(source / "config.json", tmp / "config.json")
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
        manifest, digest = write_manifest(tmp, fields, written=copy.written)
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
