"""Stage: assemble the artifact directory and its manifest, replacing the old one atomically.

Each stage output the artifact ships goes where the layout below puts it; the manifest's
fields are the stages' records read through their outputs (`manifest_fields.py`), with those
paths.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingot.artifacts import Manifest, write_manifest
from ingot.artifacts.digest import copy_file_sha256, sha256_bytes
from ingot.artifacts.signing import sign_artifact

from ..chat_template import chat_template_of
from ..manifest_fields import eval_and_interop_fields, manifest_fields, speculative_fields
from ..vocabulary_fit import artifact_tokenizer_json, bos_eos_tokens
from .eagle import EagleOutput
from .graph import BuildOutputs
from .heads import HeadsOutput
from .prepare import BuildInputs

__all__ = ["DRAFT_DIR", "EAGLE_DIR", "HEADS_DIR", "Package", "run_package"]

# Where the stage outputs go in the artifact. The target's engines under engines/<name>/, its
# portable graph at the root where the recipe asks for it (artifact.portable) or an engine
# built at load from the graph's weights has no engine file holding them (engines/base.py
# `ships_portable`: each weight is shipped once); interop/<format>/ and eval/ as the stages
# wrote them. A draft model's engines: draft/engines/<name>/ (its portable graph only where
# a draft engine built at load has no engine file to read: draft/model.onnx(.data)).
DRAFT_DIR = "draft/"
# Medusa heads: draft/heads/model.onnx(.data) (the heads stage's graph; its record goes into the
# manifest, the vLLM-layout copy stays in the stage cache).
HEADS_DIR = "draft/heads/"
# An EAGLE-3 draft: draft/eagle/model.onnx (the draft layer) and fc.onnx, each with its .data
# (the eagle stage's graphs; the speculators copy stays in the stage cache).
EAGLE_DIR = "draft/eagle/"


@dataclass(frozen=True, slots=True)
class Package:
    """What the package step assembles: the walk's outputs, the prepared inputs they were
    built from (the recipe, the source's tokenizer and config, the chat template, the signing
    key), the gates' summaries (`eval_fields`) and the lock."""

    inputs: BuildInputs
    outputs: BuildOutputs
    eval_fields: dict[str, Any]
    lock: dict[str, Any]


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
    out: Path, package: Package, known_digests: Mapping[Path, str] | None = None
) -> tuple[Manifest, str]:
    """Write the artifact to a sibling temp dir, then swap it in: a failure keeps the old one.

    The recipe's artifact.chat_template is shipped instead of the checkpoint's template;
    `known_digests` {stage file: sha256} are digests the build already holds (module
    docstring)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    copy = _Copier(tmp, known_digests or {})
    inputs = package.inputs
    try:
        _copy_outputs(copy, package.outputs, inputs.recipe.artifact.portable)
        source = inputs.source.path
        merged = artifact_tokenizer_json(source)  # tokenizer_config.json's tokens added
        if merged is None:
            copy.file(source / "tokenizer.json", tmp / "tokenizer.json")
        else:
            (tmp / "tokenizer.json").write_text(merged, encoding="utf-8")
        copy.file(source / "config.json", tmp / "config.json")
        template = inputs.chat_template
        template = template if template is not None else chat_template_of(source)
        if template is not None:
            (tmp / "chat_template.jinja").write_text(template)
        fields = _fields(package)
        bos, eos = bos_eos_tokens(source)  # what the template renders as bos / eos_token
        fields["tokenizer"] = {
            **fields["tokenizer"],
            "chat_template": "chat_template.jinja" if template is not None else None,
            "bos_token": bos,
            "eos_token": eos,
        }
        lock_bytes = (json.dumps(package.lock, indent=2, sort_keys=True) + "\n").encode()
        (tmp / "ingot.lock").write_bytes(lock_bytes)
        fields["lock"] = {"path": "ingot.lock", "sha256": sha256_bytes(lock_bytes)}
        manifest, digest = write_manifest(tmp, fields, written=copy.written)
        if inputs.sign_key is not None:  # manifest.json -> model.sig, before the artifact appears
            sign_artifact(tmp, inputs.sign_key)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest, digest


def _copy_outputs(copy: _Copier, outputs: BuildOutputs, portable: bool) -> None:
    """Every stage output the artifact ships, where it goes (the layout above); `portable`:
    the recipe's artifact.portable."""
    target, root = outputs.target, copy.root
    if target.records(portable=portable).portable:
        copy.tree(target.export.dir, root)  # model.onnx + model.onnx.data
    for name, engine in target.engines.items():
        copy.tree(engine.dir, root / "engines" / name)
    if outputs.draft is not None:
        for name, engine in outputs.draft.engines.items():
            copy.tree(engine.dir, root / DRAFT_DIR / "engines" / name)
        # An engine built at load from the graph (OpenVINO) with no engine file to read.
        if outputs.draft.records(root=DRAFT_DIR).portable:
            copy.tree(outputs.draft.export.dir, root / DRAFT_DIR)
    if outputs.heads is not None:
        for name in HeadsOutput.SHIPPED:
            copy.file(outputs.heads.dir / name, root / HEADS_DIR / name)
    if outputs.eagle is not None:
        for name in EagleOutput.SHIPPED:
            copy.file(outputs.eagle.dir / name, root / EAGLE_DIR / name)
    for fmt, interop in outputs.interop.items():  # as is
        copy.tree(interop.dir, root / "interop" / fmt, with_json=True)
    if outputs.evaluation is not None:
        copy.tree(outputs.evaluation.dir, root / "eval", with_json=True)


def _fields(package: Package) -> dict[str, Any]:
    """The manifest's fields (but the template's and the lock's): the stages' records, with
    the paths the layout gives them."""
    inputs, outputs = package.inputs, package.outputs
    recipe = inputs.recipe
    target = outputs.target.records(portable=recipe.artifact.portable)
    interop = {
        fmt: (f"interop/{fmt}", output.quantization_config())
        for fmt, output in outputs.interop.items()
    }
    fields = {
        **manifest_fields(recipe, inputs.recipe_path, inputs.cfg, target),
        **eval_and_interop_fields(target, package.eval_fields, interop),
    }
    if recipe.speculative is None:
        return fields
    draft = heads = eagle = None
    if outputs.draft is not None and inputs.draft is not None:
        draft = (inputs.draft.cfg, outputs.draft.records(root=DRAFT_DIR))
    if outputs.heads is not None:
        heads = {**outputs.heads.record(), "path": f"{HEADS_DIR}{HeadsOutput.GRAPH}"}
    if outputs.eagle is not None:
        paths = {
            "path": f"{EAGLE_DIR}{EagleOutput.GRAPH}",
            "fc_path": f"{EAGLE_DIR}{EagleOutput.FC}",
        }
        eagle = {**outputs.eagle.record(), **paths}
    fields["speculative"] = speculative_fields(recipe, draft, heads, eagle)
    return fields


def _swap_into_place(new: Path, out: Path) -> None:
    old = out.parent / f".old-{out.name}-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)
