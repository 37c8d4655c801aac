"""manifest.json: the schema of an artifact and its deterministic reader and writer.

The manifest is the artifact's identity: its digest is what `ingot push` publishes and what a
production pod pins, so the same contents must always serialize to the same bytes, and a
reader must refuse anything it does not fully understand rather than guess.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.paths import MANIFEST_NAME, SIGNATURE_NAME, iter_artifact_files

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "DraftInfo",
    "EagleInfo",
    "EngineInfo",
    "FileEntry",
    "FileRef",
    "GraphInfo",
    "HeadsInfo",
    "InteropInfo",
    "KvScales",
    "TensorSpec",
    "Manifest",
    "ModelInfo",
    "SpeculativeInfo",
    "TokenizerInfo",
    "manifest_bytes",
    "parse_manifest",
    "path_role",
    "read_manifest",
    "read_manifest_bytes",
    "reference_problems",
    "write_manifest",
]

FORMAT = "ingot.artifact"
FORMAT_VERSION = 1

# A manifest is a few MB at most even for sharded 70B checkpoints; the cap keeps a hostile
# file from exhausting memory before it is even parsed.
_MAX_MANIFEST_BYTES = 64 << 20

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="lowercase hex SHA-256")]
Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    # strict: a manifest is machine-written, so "1" for 1 is a bug to report, not to coerce.
    # ser_json_inf_nan="constants": keep NaN as NaN so serialization refuses it; pydantic's
    # default would silently write null in its place.
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, ser_json_inf_nan="constants"
    )


class FileRef(_Strict):
    """A file the manifest depends on by digest (today: the build lock)."""

    path: str = Field("ingot.lock", description="relative path inside the artifact")
    sha256: Sha256Hex


class FileEntry(_Strict):
    """One file of the artifact, as verified before anything loads it."""

    path: str = Field(description="relative POSIX path inside the artifact")
    size: NonNegative = Field(description="size in bytes")
    sha256: Sha256Hex
    # Which pull target needs it (artifacts/roles.py). Written by write_manifest from the path;
    # a manifest written before the field gets the same derivation when it is read.
    role: str = Field(
        pattern=r"^[a-z][a-z0-9_-]*(:[A-Za-z0-9._-]+)?$",
        description="common | portable | eval | draft | engine:<name> | draft:<engine name> "
        "| interop:<format>",
    )


def path_role(path: str, graph_path: str, interop: Mapping[str, str]) -> str:
    """The role of the artifact file `path`: `graph_path` is the portable graph's path,
    `interop` maps each interop export's directory to its format."""
    parts = path.split("/")
    if parts[0] == "engines" and len(parts) > 2:
        return f"engine:{parts[1]}"
    if parts[0] == "draft":
        return f"draft:{parts[2]}" if parts[1:2] == ["engines"] and len(parts) > 3 else "draft"
    if parts[0] == "eval":
        return "eval"
    if parts[0] == "interop":
        for directory, fmt in interop.items():
            if path.startswith(directory.rstrip("/") + "/"):
                return f"interop:{fmt}"
        return f"interop:{parts[1]}" if len(parts) > 2 else "common"
    # the graph and its external data (model.onnx.data)
    if path == graph_path or path.startswith(graph_path + "."):
        return "portable"
    return "common"


class ModelInfo(_Strict):
    """The model configuration the runtime needs without reading the checkpoint."""

    architecture: str = Field(description="HF architecture name, e.g. LlamaForCausalLM")
    vocab_size: Positive
    hidden_size: Positive
    num_layers: Positive
    num_heads: Positive
    num_kv_heads: Positive
    head_dim: Positive
    max_seq_len: Positive
    sliding_window: Positive | None = Field(
        None, description="Mistral-style attention window (the runtime's mask enforces it)"
    )
    layer_windows: list[Positive | None] | None = Field(
        None,
        description="a model mixing local and global layers: each layer's window (null: the "
        "whole context), the local layers reading the graph's *_local inputs; absent: "
        "sliding_window on every layer",
    )
    bos_token_id: NonNegative | None
    eos_token_ids: list[NonNegative]
    tie_word_embeddings: bool
    quantization: list[dict[str, Any]] = Field(
        default_factory=list, description="one entry per applied quantization step"
    )

    @model_validator(mode="after")
    def _windows_fit(self) -> ModelInfo:
        windows = self.layer_windows
        if windows is None:
            return self
        if len(windows) != self.num_layers or {w for w in windows if w} != {self.sliding_window}:
            raise ValueError(
                f"model.layer_windows {windows}: one entry per layer ({self.num_layers}), each "
                f"null or sliding_window ({self.sliding_window})"
            )
        return self

    def window_of(self, layer: int) -> int | None:
        """Layer `layer`'s attention window (None: the whole context)."""
        return self.sliding_window if self.layer_windows is None else self.layer_windows[layer]


class TokenizerInfo(_Strict):
    """Where the tokenizer and chat template live and the special tokens they use."""

    path: str = Field("tokenizer.json", description="relative path of the tokenizers JSON")
    chat_template: str | None = Field(None, description="relative path, e.g. chat_template.jinja")
    bos_token: str | None = None
    eos_token: str | None = None


class TensorSpec(_Strict):
    """One tensor of the graph interface: name, element type and shape (symbolic dims as names)."""

    name: str
    dtype: str = Field(description="element type, e.g. float32, int64, bool")
    shape: list[int | str] = Field(description="dimensions; strings are symbolic (S, Q, NB)")


FiniteScale = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class KvScales(_Strict):
    """The per-head scales of an int8 / fp8 KV cache: a stored code c stands for c * scale
    (symmetric, zero point 0); K's after RoPE. Indexed [layer][kv head]."""

    k: list[list[FiniteScale]]
    v: list[list[FiniteScale]]


class GraphInfo(_Strict):
    """The exported graph and the interface the runtime binds to it."""

    path: str = Field("model.onnx", description="relative path of the ONNX graph")
    opset: Positive
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    num_layers: Positive
    kv_block_size: Positive
    kv_dtype: Literal["fp32", "fp16", "int8", "fp8"] = Field(
        description="what the KV pool holds: values (fp32, fp16) or 8-bit codes (int8, fp8 "
        "E4M3FN, whose pool inputs are typed uint8: the codes' bytes)"
    )
    num_kv_heads: Positive
    head_dim: Positive
    kv_scales: KvScales | None = Field(
        None, description="present iff kv_dtype is int8 or fp8 (calibrated per head)"
    )

    @model_validator(mode="after")
    def _scales_fit(self) -> GraphInfo:
        quantized = self.kv_dtype in ("int8", "fp8")
        if quantized != (self.kv_scales is not None):
            what = "needs kv_scales" if quantized else "has no use for kv_scales"
            raise ValueError(f"graph.kv_dtype {self.kv_dtype} {what}")
        if self.kv_scales is None:
            return self
        for name in ("k", "v"):
            rows = getattr(self.kv_scales, name)
            shape = (len(rows), *sorted({len(r) for r in rows}))
            if shape != (self.num_layers, self.num_kv_heads):
                raise ValueError(
                    f"graph.kv_scales.{name}: shape {shape} is not [num_layers, num_kv_heads] "
                    f"= {(self.num_layers, self.num_kv_heads)}"
                )
        return self


class InteropInfo(_Strict):
    """A checkpoint in another engine's format (GPTQ, AWQ, compressed-tensors)."""

    format: str = Field(description="gptq | awq | compressed-tensors")
    path: str = Field(description="relative directory: config.json, model.safetensors, tokenizer")
    quantization_config: dict[str, Any] = Field(description="as written in its config.json")


class EngineInfo(_Strict):
    """One built engine and what a host needs to run it."""

    name: str = Field(description="unique target name, e.g. onnxruntime-cpu")
    # The kind names the runtime plug-in that runs it (runtime/engines/<kind>/): an open set,
    # so a new engine needs no change to the format. A runtime without that plug-in skips the
    # engine, saying why (runtime/engine_select.py); "tensorrt" is reserved, built by no stage.
    engine: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="engine kind: onnxruntime, or another engine plug-in's name",
    )
    device: str = Field(description="cpu, cuda, ...")
    path: str = Field(description="relative path of the engine file")
    requires: dict[str, Any] = Field(
        default_factory=dict,
        description='host requirements: onnxruntime engines {"onnxruntime": ">=1.23,<2", '
        '"cpu_isa": ["avx2"]}; the reserved tensorrt kind (not built yet) must record '
        '{"tensorrt": "==10.14.1", "cuda": ">=12.8", "compute_capability": "9.0"}',
    )
    session_options: dict[str, Any] = Field(
        default_factory=dict, description="what the runtime sets when it loads the engine"
    )
    build: dict[str, Any] = Field(
        default_factory=dict, description="how the engine was built (informational)"
    )
    reads: list[str] = Field(
        default_factory=list,
        description="the roles of files it reads besides common and its own engine:<name> "
        "(openvino: portable); what `ingot pull --target` fetches for it (artifacts/roles.py)",
    )


class DraftInfo(_Strict):
    """The draft model of speculative.method draft_model, packed under draft/."""

    model: ModelInfo
    graph: GraphInfo = Field(
        description="the draft graph's interface; path = its first engine's (no portable "
        "graph of the draft is shipped)"
    )
    engines: list[EngineInfo] = Field(
        min_length=1, description="the target's engine names, paths under draft/"
    )


class HeadsInfo(_Strict):
    """The Medusa heads of speculative.method medusa: a graph under draft/heads/ mapping the
    target's final hidden state [N, hidden_size] to num_heads greedy tokens [N, num_heads]."""

    method: Literal["medusa"] = "medusa"
    num_heads: Positive
    num_layers: Positive
    hidden_size: Positive
    vocab_size: Positive
    origin: Literal["train", "attach"]
    path: str = Field(description="relative path of the heads' ONNX graph")
    training: dict[str, Any] | None = Field(None, description="the training report (train)")
    check: dict[str, Any] | None = Field(None, description="the graph against the heads")


class EagleInfo(_Strict):
    """The EAGLE-3 draft of speculative.method eagle: one decoder layer under draft/eagle/
    (`path`, the paged-KV interface with one layer and a float32 pool) fed by `fc_path`, which
    maps the target's three aux states (the target graph's `aux_hidden` [S, Q, 3 *
    target_hidden_size], the residual streams entering layers `aux_layers`) to hidden_size."""

    method: Literal["eagle"] = "eagle"
    origin: Literal["train", "attach"]
    path: str = Field(description="relative path of the draft layer's ONNX graph")
    fc_path: str = Field(description="relative path of the ONNX graph of fc (features -> hidden)")
    hidden_size: Positive
    target_hidden_size: Positive
    num_heads: Positive
    num_kv_heads: Positive
    head_dim: Positive
    intermediate_size: Positive
    vocab_size: Positive
    draft_vocab_size: Positive
    aux_layers: list[NonNegative] = Field(min_length=3, max_length=3)
    kv_block_size: Positive
    training: dict[str, Any] | None = Field(None, description="the training report (train)")
    check: dict[str, Any] | None = Field(None, description="the graphs against the draft")

    @model_validator(mode="after")
    def _sizes(self) -> EagleInfo:
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size ({self.vocab_size})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        return self


class SpeculativeInfo(_Strict):
    """The recipe's speculative decoding: the runtime's default method."""

    method: Literal["ngram", "draft_model", "medusa", "eagle"]
    num_speculative_tokens: Positive
    prompt_lookup_min: Positive = 1
    prompt_lookup_max: Positive = 4
    draft: DraftInfo | None = Field(None, description="present iff method is draft_model")
    heads: HeadsInfo | None = Field(None, description="present iff method is medusa")
    eagle: EagleInfo | None = Field(None, description="present iff method is eagle")

    @model_validator(mode="after")
    def _draft_iff_draft_model(self) -> SpeculativeInfo:
        if (self.draft is not None) != (self.method == "draft_model"):
            has = "has" if self.draft is not None else "lacks"
            raise ValueError(f"method {self.method} {has} a draft (present iff draft_model)")
        if (self.heads is not None) != (self.method == "medusa"):
            has = "has" if self.heads is not None else "lacks"
            raise ValueError(f"method {self.method} {has} heads (present iff medusa)")
        if (self.eagle is not None) != (self.method == "eagle"):
            has = "has" if self.eagle is not None else "lacks"
            raise ValueError(f"method {self.method} {has} an eagle draft (present iff eagle)")
        if self.heads is not None and self.num_speculative_tokens > self.heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens ({self.num_speculative_tokens}) exceeds "
                f"heads.num_heads ({self.heads.num_heads})"
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) is above prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        return self


class Manifest(_Strict):
    """manifest.json, format `ingot.artifact` version 1."""

    format: Literal["ingot.artifact"] = FORMAT
    format_version: int = FORMAT_VERSION
    name: str
    version: str
    recipe: dict[str, Any] = Field(description="the resolved recipe")
    lock: FileRef
    model: ModelInfo
    tokenizer: TokenizerInfo = Field(default_factory=TokenizerInfo)
    graph: GraphInfo
    engines: list[EngineInfo] = Field(min_length=1, description="in order of preference")
    eval: dict[str, Any] | None = None
    interop: list[InteropInfo] = Field(
        default_factory=list, description="checkpoints for other engines under interop/"
    )
    speculative: SpeculativeInfo | None = Field(
        None, description="speculative decoding; absent when the recipe has no such section"
    )
    files: list[FileEntry] = Field(description="every file except manifest.json, by path")

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != FORMAT_VERSION:
            raise ValueError(f"format_version {v} is not supported (supported: {FORMAT_VERSION})")
        return v

    @model_validator(mode="before")
    @classmethod
    def _derive_roles(cls, data: Any) -> Any:
        """Manifests written before `role` existed: each file's role from its path."""
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, list) or all(
            not isinstance(f, dict) or "role" in f for f in files
        ):
            return data
        graph = data.get("graph") if isinstance(data.get("graph"), dict) else {}
        graph_path = graph.get("path", "model.onnx")
        interop = {
            i["path"]: i["format"]
            for i in data.get("interop") or []
            if isinstance(i, dict) and isinstance(i.get("path"), str)
            and isinstance(i.get("format"), str)
        }  # fmt: skip
        derived = [
            {**f, "role": path_role(f["path"], str(graph_path), interop)}
            if isinstance(f, dict) and "role" not in f and isinstance(f.get("path"), str)
            else f
            for f in files
        ]
        return {**data, "files": derived}

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            dupes = sorted({p for p in paths if paths.count(p) > 1})
            raise ValueError(f"files lists a path more than once: {', '.join(dupes)}")
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        _graph_fits_model(self.graph, self.model, "")
        draft = self.speculative.draft if self.speculative is not None else None
        if draft is not None:
            _draft_fits_target(draft, self)
        heads = self.speculative.heads if self.speculative is not None else None
        if heads is not None:
            _heads_fit_target(heads, self.model)
        eagle = self.speculative.eagle if self.speculative is not None else None
        if eagle is not None:
            _eagle_fits_target(eagle, self)
        known = self.known_roles()
        interop = {i.path: i.format for i in self.interop}
        for entry in self.files:
            # A role its path gives is always known: an older manifest with an engine directory
            # no record names (a full pull still fetches it) loads as it did.
            derived = path_role(entry.path, self.graph.path, interop)
            if entry.role not in known and entry.role != derived:
                raise ValueError(
                    f"files[{entry.path}]: role {entry.role!r} is not one this manifest knows "
                    f"({', '.join(sorted(known))})"
                )
        for engine in self.engines:
            if not set(engine.reads) <= known:
                unknown = ", ".join(sorted(set(engine.reads) - known))
                raise ValueError(f"engines[{engine.name}].reads: unknown role {unknown}")
        return self

    def known_roles(self) -> set[str]:
        """Every role a file of this manifest may have (artifacts/roles.py uses them)."""
        roles = {"common", "portable", "eval", "draft"}
        roles |= {f"engine:{e.name}" for e in self.engines}
        roles |= {f"draft:{e.name}" for e in self.engines}
        roles |= {f"interop:{i.format}" for i in self.interop}
        return roles

    def referenced_paths(self) -> dict[str, str]:
        """{manifest field: relative path} for every file the manifest points at."""
        refs = {"lock.path": self.lock.path, "tokenizer.path": self.tokenizer.path}
        if self.tokenizer.chat_template is not None:
            refs["tokenizer.chat_template"] = self.tokenizer.chat_template
        refs["graph.path"] = self.graph.path
        for engine in self.engines:
            refs[f"engines[{engine.name}].path"] = engine.path
        heads = self.speculative.heads if self.speculative is not None else None
        if heads is not None:
            refs["speculative.heads.path"] = heads.path
        eagle = self.speculative.eagle if self.speculative is not None else None
        if eagle is not None:
            refs["speculative.eagle.path"] = eagle.path
            refs["speculative.eagle.fc_path"] = eagle.fc_path
        draft = self.speculative.draft if self.speculative is not None else None
        if draft is not None:
            refs["speculative.draft.graph.path"] = draft.graph.path
            for engine in draft.engines:
                refs[f"speculative.draft.engines[{engine.name}].path"] = engine.path
        return refs


def _graph_fits_model(graph: GraphInfo, model: ModelInfo, prefix: str) -> None:
    # The runtime sizes its KV pool from the graph and checks it against the model; a
    # disagreement here means the export and the config describe different models.
    for field in ("num_layers", "num_kv_heads", "head_dim"):
        if getattr(graph, field) != getattr(model, field):
            raise ValueError(
                f"{prefix}graph.{field} ({getattr(graph, field)}) differs from "
                f"{prefix}model.{field} ({getattr(model, field)})"
            )
    # Local and global layers mixed: the graph must give the local ones their own inputs.
    local = model.layer_windows is not None
    inputs = {spec.name for spec in graph.inputs}
    if local and not {"block_tables_local", "kv_slots_local", "attention_mask_local"} <= inputs:
        raise ValueError(
            f"{prefix}model.layer_windows mixes local and global layers but {prefix}graph has "
            "no block_tables_local / kv_slots_local / attention_mask_local inputs"
        )


def _heads_fit_target(heads: HeadsInfo, model: ModelInfo) -> None:
    """The heads read the target's hidden state and propose its token ids."""
    for field in ("hidden_size", "vocab_size"):
        if getattr(heads, field) != getattr(model, field):
            raise ValueError(
                f"speculative.heads.{field} ({getattr(heads, field)}) differs from "
                f"model.{field} ({getattr(model, field)})"
            )


def _eagle_fits_target(eagle: EagleInfo, manifest: Manifest) -> None:
    """The draft reads the target's aux states and token embeddings, proposes its token ids
    and keeps its K/V in the slots of the target's block tables."""
    model, graph = manifest.model, manifest.graph
    pairs = (
        ("target_hidden_size", eagle.target_hidden_size, "model.hidden_size", model.hidden_size),
        ("vocab_size", eagle.vocab_size, "model.vocab_size", model.vocab_size),
        ("kv_block_size", eagle.kv_block_size, "graph.kv_block_size", graph.kv_block_size),
    )
    for field, value, other, expected in pairs:
        if value != expected:
            raise ValueError(
                f"speculative.eagle.{field} ({value}) differs from {other} ({expected})"
            )
    outside = [i for i in eagle.aux_layers if i >= model.num_layers]
    if outside:
        raise ValueError(
            f"speculative.eagle.aux_layers {eagle.aux_layers}: {outside} not below "
            f"model.num_layers ({model.num_layers})"
        )
    if "aux_hidden" not in {o.name for o in graph.outputs}:
        raise ValueError("speculative.eagle: graph.outputs has no aux_hidden (the draft's input)")


def _draft_fits_target(draft: DraftInfo, manifest: Manifest) -> None:
    """The runtime shares one block table between the two models and verifies the draft's
    tokens with the target's logits: same block size, same vocabulary, engines it can pair."""
    prefix = "speculative.draft."
    _graph_fits_model(draft.graph, draft.model, prefix)
    if draft.graph.kv_block_size != manifest.graph.kv_block_size:
        raise ValueError(
            f"{prefix}graph.kv_block_size ({draft.graph.kv_block_size}) differs from "
            f"graph.kv_block_size ({manifest.graph.kv_block_size})"
        )
    if draft.model.vocab_size != manifest.model.vocab_size:
        raise ValueError(
            f"{prefix}model.vocab_size ({draft.model.vocab_size}) differs from "
            f"model.vocab_size ({manifest.model.vocab_size})"
        )
    names = [e.name for e in draft.engines]
    if len(set(names)) != len(names):
        raise ValueError(f"{prefix}engines: names must be unique, got {names}")
    targets = {e.name for e in manifest.engines}
    unknown = [n for n in names if n not in targets]
    if unknown:
        raise ValueError(
            f"{prefix}engines: {', '.join(unknown)} not among the target's engines "
            f"({', '.join(sorted(targets))})"
        )


def reference_problems(manifest: Manifest) -> list[str]:
    """Referenced paths missing from `files`, and a lock digest that disagrees with its entry.

    A reference outside `files` would be loaded without ever being verified.
    """
    listed = {f.path: f for f in manifest.files}
    problems = [
        f"{path}: referenced by {field} but not listed in files"
        for field, path in manifest.referenced_paths().items()
        if path not in listed
    ]
    entry = listed.get(manifest.lock.path)
    if entry is not None and entry.sha256 != manifest.lock.sha256:
        problems.append(
            f"{manifest.lock.path}: lock sha256 mismatch "
            f"(lock {manifest.lock.sha256[:12]}…, files entry {entry.sha256[:12]}…)"
        )
    return problems


def manifest_bytes(manifest: Manifest) -> bytes:
    """The canonical serialization: sorted keys, 2-space indent, ASCII, trailing newline."""
    try:
        data = manifest.model_dump(mode="json")
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as e:  # NaN / Infinity: not JSON, and not portable to other readers
        raise ArtifactError(f"manifest cannot be serialized as JSON: {e}") from e
    return (text + "\n").encode("ascii")


def write_manifest(
    root: Path,
    manifest_fields: dict[str, Any],
    *,
    written: Mapping[str, tuple[int, str]] | None = None,
) -> tuple[Manifest, str]:
    """Hash every file under `root`, validate, and atomically write root/manifest.json.

    `manifest_fields` holds every field except `files`, which is computed here so it can never
    disagree with the directory. `written` ({relative path: (size, sha256 hex)}) are digests
    the caller took of the very bytes it wrote into `root` (hashed while copying): those files
    are not read again, unless their size on disk differs. Returns the manifest and its
    digest, `sha256:<hex>`.
    """
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    if "files" in manifest_fields:
        raise ArtifactError("manifest fields: 'files' is computed from the directory; omit it")
    written = written or {}
    files = []
    for rel in iter_artifact_files(root):
        if rel == SIGNATURE_NAME:  # a signature of the old manifest; re-sign after writing
            continue
        size = (root / rel).stat().st_size
        known = written.get(rel)
        sha = known[1] if known is not None and known[0] == size else sha256_file(root / rel)
        files.append({"path": rel, "size": size, "sha256": sha})
    manifest = _validate({**manifest_fields, "files": files}, "manifest fields")
    problems = reference_problems(manifest)
    if problems:
        raise ArtifactError.from_problems(f"{root}: refusing to write manifest", problems)

    data = manifest_bytes(manifest)
    _atomic_write(root / MANIFEST_NAME, data)
    return manifest, "sha256:" + sha256_bytes(data)


def read_manifest_bytes(root: Path) -> bytes:
    """The raw bytes of root/manifest.json, refusing a link or a non-regular file."""
    path = Path(root) / MANIFEST_NAME
    try:
        # O_NOFOLLOW: check and read the same file, with no window to swap in a link.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing; not an ingot artifact directory") from None
    except OSError as e:
        why = "is a symbolic link" if path.is_symlink() else f"cannot be read ({e.strerror})"
        raise ArtifactError(f"{path}: {why}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{path}: not a regular file")
        if info.st_size > _MAX_MANIFEST_BYTES:
            limit = _MAX_MANIFEST_BYTES
            raise ArtifactError(f"{path}: {info.st_size} bytes, over the {limit} byte limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read_manifest(root: Path) -> Manifest:
    """Parse and validate root/manifest.json (its files are not checked: see verify_artifact)."""
    return parse_manifest(read_manifest_bytes(root), str(Path(root) / MANIFEST_NAME))


def parse_manifest(raw: bytes, path: str) -> Manifest:
    """Parse and validate the bytes of a manifest.json; `path` names it in errors."""
    try:
        data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, duplicate keys
        raise ArtifactError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(data).__name__}")

    found = data.get("format")
    if found != FORMAT:
        raise ArtifactError(f"{path}: format is {found!r}, expected {FORMAT!r}")
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        hint = "; written by a newer ingot, upgrade to read it" if _is_newer(version) else ""
        raise ArtifactError(
            f"{path}: format_version {version!r} is not supported "
            f"(supported: {FORMAT_VERSION}){hint}"
        )
    return _validate(data, str(path))


def _is_newer(version: object) -> bool:
    return type(version) is int and version > FORMAT_VERSION


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which duplicate wins; a signed manifest must mean one thing.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _validate(data: dict[str, Any], source: str) -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        problems = [_describe(err) for err in e.errors()]
        raise ArtifactError.from_problems(f"{source}: invalid manifest", problems) from None


def _describe(err: Any) -> str:
    loc = ".".join(str(part) for part in err["loc"]) or "manifest"
    value = err.get("input")
    # Show the offending value only when it is short; a whole recipe dict would drown the line.
    if isinstance(value, str | int | float | bool) and len(repr(value)) <= 80:
        return f"{loc}: {err['msg']} (got {value!r})"
    return f"{loc}: {err['msg']}"


def _atomic_write(path: Path, data: bytes) -> None:
    # A reader (or a crash) must see the old manifest or the new one, never half of one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the serving user must be able to read it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
