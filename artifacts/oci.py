"""Push and pull artifacts as CNCF ModelPack OCI artifacts.

An artifact directory becomes one OCI image manifest:
  - `artifactType: application/vnd.cncf.model.manifest.v1+json`;
  - a model config blob (`application/vnd.cncf.model.config.v1+json`): descriptor (name,
    version, family), config (architecture, format, paramSize, precision, quantization) and
    modelfs (`diffIds`: the layer digests; raw layers are their own uncompressed content);
  - one raw layer per file, manifest.json and model.sig included, each annotated with its
    relative path (`org.cncf.model.filepath`, `org.opencontainers.image.title`). No tarballs:
    a layer's digest is the file's sha256, the same one manifest.json lists.
Nothing time- or host-dependent goes in, so one artifact always gives one manifest digest.

Pulling never trusts the registry: the manifest's paths are validated before anything is
written, each blob is checked against its descriptor before it enters the store, and the
materialized directory is verified against manifest.json before it is renamed into place.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Collection
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

from ingot.artifacts.digest import sha256_bytes, sha256_file
from ingot.artifacts.errors import ArtifactError
from ingot.artifacts.fingerprint import save_fingerprints, take_fingerprints
from ingot.artifacts.manifest import Manifest, parse_manifest, read_manifest_bytes
from ingot.artifacts.partial import PartialRecord, read_partial
from ingot.artifacts.paths import MANIFEST_NAME, SIGNATURE_NAME, display_path, unsafe_path_reason
from ingot.artifacts.reference import parse_reference
from ingot.artifacts.registry_client import RegistryClient, Retry
from ingot.artifacts.roles import check_roles, files_with_roles
from ingot.artifacts.store import BlobStore, FileBlob, materialize, verify_stored
from ingot.artifacts.verify import check_artifact

__all__ = [
    "ARTIFACT_TYPE",
    "CONFIG_MEDIA_TYPE",
    "MANIFEST_MEDIA_TYPE",
    "PullResult",
    "PushResult",
    "layer_media_type",
    "model_config",
    "parse_model_manifest",
    "pull",
    "push",
]

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
_RAW_TYPES = frozenset({WEIGHT, WEIGHT_CONFIG, DOC} | {
    f"application/vnd.cncf.model.{kind}.v1.raw" for kind in ("code", "dataset")
})  # fmt: skip
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"

_MAX_MANIFEST_BYTES = 4 << 20  # the OCI distribution spec's own limit for manifests
_MAX_CONFIG_BYTES = 1 << 20
_MAX_ARTIFACT_MANIFEST_BYTES = 64 << 20  # manifest.py's own limit
_MAX_LAYERS = 100_000
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_CONFIG_SUFFIXES = frozenset({".json", ".jinja", ".lock", ".sig", ".yaml", ".txt", ".model"})
_DOC_SUFFIXES = frozenset({".md", ".png", ".svg", ".html"})


@dataclass(frozen=True, slots=True)
class PushResult:
    reference: str  # host/repo@sha256:…, what a production pod should pin
    digest: str
    tag: str | None

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "tag": self.tag}


@dataclass(frozen=True, slots=True)
class PullResult:
    path: Path
    reference: str  # host/repo@sha256:…
    digest: str  # of the OCI manifest
    downloaded_bytes: int  # 0 when every blob came from the store
    manifest: Manifest  # the artifact's, its files verified at `path` (those present)
    partial: PartialRecord | None = None  # what was not pulled; None: every file

    @property
    def absent(self) -> tuple[str, ...]:
        return self.partial.absent if self.partial is not None else ()

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "reference": self.reference,
            "digest": self.digest,
            "downloaded_bytes": self.downloaded_bytes,
            "roles": sorted(
                self.partial.roles if self.partial else {f.role for f in self.manifest.files}
            ),
            "absent": list(self.absent),
        }


def layer_media_type(path: str) -> str:
    """ModelPack's raw media type for an artifact file: weights, their configs, or docs."""
    pure = PurePosixPath(path)
    if pure.parts[0] == "eval" or pure.suffix in _DOC_SUFFIXES:
        return DOC
    if pure.suffix in _CONFIG_SUFFIXES:
        return WEIGHT_CONFIG
    return WEIGHT  # graphs, external weights, engines, checkpoints


def push(
    artifact: Path | str,
    reference: str,
    *,
    insecure: bool = False,
    retry: Retry | None = None,
) -> PushResult:
    """Verify the artifact at `artifact`, then push it to `reference` (which needs a tag)."""
    root = Path(artifact)
    ref = parse_reference(reference)
    if ref.tag is None or ref.digest is not None:
        raise ArtifactError(f"{ref}: push to a tag (oci://host/repo:tag); the digest is computed")
    verified = check_artifact(root)
    if verified.absent:
        raise ArtifactError(
            f"{root}: a partial artifact ({len(verified.absent)} files not pulled, e.g. "
            f"{verified.absent[0]}); push the whole artifact"
        )
    manifest = verified.manifest
    files = [(entry.path, entry.size, entry.sha256) for entry in manifest.files]
    manifest_data = read_manifest_bytes(root)
    files.append((MANIFEST_NAME, len(manifest_data), sha256_bytes(manifest_data)))
    signature = root / SIGNATURE_NAME
    if signature.is_file() and not signature.is_symlink():
        files.append((SIGNATURE_NAME, signature.stat().st_size, sha256_file(signature)))
    files.sort()
    layers = [_layer(path, size, "sha256:" + hexdigest) for path, size, hexdigest in files]
    config = _canonical(model_config(manifest, root, [layer["digest"] for layer in layers]))
    config_desc = {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config), "size": len(config)}
    oci_manifest = _canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": config_desc,
        "layers": layers,
        "annotations": {
            "org.opencontainers.image.title": manifest.name,
            "org.opencontainers.image.version": manifest.version,
        },
    })  # fmt: skip
    digest = _digest(oci_manifest)

    client = RegistryClient(ref, insecure=insecure, retry=retry)
    if not client.has_blob(config_desc["digest"]):
        client.upload_blob(config_desc["digest"], len(config), partial(nullcontext, config))
    for (path, size, _), layer in zip(files, layers, strict=True):
        if not client.has_blob(layer["digest"]):
            client.upload_blob(layer["digest"], size, partial(open, root / path, "rb"))
    client.put_manifest(oci_manifest, MANIFEST_MEDIA_TYPE, digest)
    return PushResult(ref.with_digest(digest).pinned(), digest, ref.tag)


# What a pull fetches: None (every file), a set of roles, or a function of the artifact's
# manifest giving one of those (the runtime's engine selection; artifacts/roles.py).
Roles = Collection[str] | Callable[[Manifest], Collection[str] | None] | None


def pull(
    reference: str,
    *,
    out: Path | str | None = None,
    store: BlobStore | None = None,
    insecure: bool = False,
    retry: Retry | None = None,
    check: Callable[[Path], object] | None = None,
    roles: Roles = None,
    trust_existing: bool = False,
) -> PullResult:
    """Pull `reference` into the store and materialize it at `out` (default: in the store).

    First the OCI manifest, the artifact's manifest.json and model.sig; `check(dir)` runs on a
    directory holding those two (a signature check, say) before any other blob is fetched, and
    whatever it raises aborts the pull. Then only the files of `roles` (None: all), each hashed
    as it streams in. Blobs already in the store are not downloaded again, and a digest
    reference whose artifact is already materialized in the store with every file asked for
    needs no network at all: its files are checked by their recorded stat (fingerprint.py),
    re-hashing only those that changed. `trust_existing` is accepted for compatibility; that
    check is always made.
    """
    del trust_existing  # the stat check is cheap enough to make on every load
    ref = parse_reference(reference)
    store = store or BlobStore()
    data = store.read_blob(ref.digest, _MAX_MANIFEST_BYTES) if ref.digest else None
    client = None
    if data is None:
        client = RegistryClient(ref, insecure=insecure, retry=retry)
        data = client.get_manifest(MANIFEST_MEDIA_TYPE, _MAX_MANIFEST_BYTES)
    digest = _digest(data)
    if ref.digest is not None and digest != ref.digest:
        raise ArtifactError(f"{ref}: the registry's manifest has digest {digest}; refused")
    pinned = ref.with_digest(digest)
    config, blobs = parse_model_manifest(data, str(pinned))
    fetcher = _Fetcher(store, pinned, client, insecure, retry)

    heads = [b for b in blobs if b.path in (MANIFEST_NAME, SIGNATURE_NAME)]
    fetcher.fetch([config, *heads])
    manifest = _artifact_manifest(store, blobs, str(pinned))
    if check is not None:
        _check_heads(store, heads, check)
    wanted = roles(manifest) if callable(roles) else roles
    wanted = None if wanted is None else check_roles(manifest, wanted)

    target = Path(out) if out is not None else store.artifact_dir(digest)
    have: set[str] = set()
    if out is None and (target / MANIFEST_NAME).is_file():
        have = _stored_files(target)
        needed = {f.path for f in files_with_roles(manifest, wanted)}
        if have and needed <= have:
            record = read_partial(target)
            downloaded = fetcher.downloaded  # manifest.json or model.sig, if they were not stored
            return PullResult(target, pinned.pinned(), digest, downloaded, manifest, record)
    paths = {f.path for f in files_with_roles(manifest, wanted)} | have
    chosen = [b for b in blobs if b.path in paths or b in heads]
    fetcher.fetch(chosen)
    partial = _partial_record(manifest, blobs, chosen)
    try:
        materialize(store, chosen, target, partial=partial, checked=fetcher.checked)
    except ArtifactError:
        # A store blob damaged on disk since it was stored: drop it so the next pull refetches.
        for blob in chosen:
            stored = store.blob_path(blob.digest)
            if stored.is_file() and "sha256:" + sha256_file(stored) != blob.digest:
                store.evict(blob.digest)
        raise
    if out is None:
        keys = take_fingerprints(target, [b.path for b in chosen if b not in heads])
        save_fingerprints(store.fingerprint_path(digest), _manifest_sha(heads), keys)
    store.put_bytes(data)  # last: a digest reference then resolves without the registry
    return PullResult(target, pinned.pinned(), digest, fetcher.downloaded, manifest, partial)


class _Fetcher:
    """Downloads blobs missing from the store, each hashed as it streams in."""

    def __init__(self, store, pinned, client, insecure, retry) -> None:  # noqa: ANN001
        self.store, self.pinned, self.client = store, pinned, client
        self.insecure, self.retry = insecure, retry
        self.downloaded = 0
        self.checked: set[str] = set()  # digests hashed on their way in by this pull

    def fetch(self, blobs: list[FileBlob]) -> None:
        for blob in blobs:
            if self.store.has_blob(blob.digest, blob.size):
                continue
            self.client = self.client or RegistryClient(
                self.pinned, insecure=self.insecure, retry=self.retry
            )
            with self.store.open_partial(blob) as partial:
                if not self.store.has_blob(blob.digest, blob.size):  # a concurrent pull did it
                    self.downloaded += blob.size - partial.offset
                    self.client.fetch_blob(blob, partial)
                    self.checked.add(blob.digest)


def _artifact_manifest(store: BlobStore, blobs: list[FileBlob], source: str) -> Manifest:
    """manifest.json from the store, checked to describe exactly the OCI manifest's layers."""
    head = next(b for b in blobs if b.path == MANIFEST_NAME)
    raw = store.read_blob(head.digest, _MAX_ARTIFACT_MANIFEST_BYTES)
    if raw is None:
        raise ArtifactError(f"{source}: {MANIFEST_NAME} blob is damaged in the store; pull again")
    manifest = parse_manifest(raw, f"{source} {MANIFEST_NAME}")
    layers = {b.path: b for b in blobs if b.path not in (MANIFEST_NAME, SIGNATURE_NAME)}
    problems = [
        f"{f.path}: {MANIFEST_NAME} lists it as {f.size} bytes {f.sha256[:12]}…, the layer differs"
        for f in manifest.files
        if f.path in layers
        and (layers[f.path].digest != "sha256:" + f.sha256 or layers[f.path].size != f.size)
    ]
    listed = {f.path for f in manifest.files}
    problems += [f"{p}: a layer {MANIFEST_NAME} does not list" for p in layers if p not in listed]
    problems += [f"{p}: listed in {MANIFEST_NAME} but no layer" for p in listed - set(layers)]
    if problems:
        raise ArtifactError.from_problems(f"{source}: manifest refused", problems)
    return manifest


def _check_heads(store: BlobStore, heads: list[FileBlob], check: Callable[[Path], object]) -> None:
    """Run `check` on a directory of manifest.json and model.sig alone, before the rest."""
    (store.root / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=store.root / "tmp", prefix="check-"))
    try:
        for blob in heads:  # small files: copies work on any filesystem
            shutil.copyfile(store.blob_path(blob.digest), work / blob.path)
        check(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stored_files(target: Path) -> set[str]:
    """The files of the store's artifact directory, checked by their recorded stat (files that
    changed since are hashed again); empty, and the directory removed, if it does not verify."""
    try:
        verified = verify_stored(target)
    except ArtifactError:
        shutil.rmtree(target)  # damaged since: materialize it again from checked blobs
        return set()
    return {f.path for f in verified.manifest.files} - set(verified.absent)


def _partial_record(
    manifest: Manifest, blobs: list[FileBlob], chosen: list[FileBlob]
) -> PartialRecord | None:
    absent = sorted({b.path for b in blobs} - {b.path for b in chosen})
    if not absent:
        return None
    present = {b.path for b in chosen}
    roles = sorted({f.role for f in manifest.files if f.path in present})
    raw_digest = next(b.digest for b in blobs if b.path == MANIFEST_NAME)
    return PartialRecord(raw_digest, tuple(roles), tuple(absent))


def _manifest_sha(heads: list[FileBlob]) -> str:
    return next(b.digest for b in heads if b.path == MANIFEST_NAME)


def parse_model_manifest(data: bytes, source: str) -> tuple[FileBlob, list[FileBlob]]:
    """(config blob, file blobs) of a ModelPack manifest, refused whole on any problem.

    Checked before anything is written: OCI media type, ModelPack artifact type, descriptor
    digests and sizes, raw (never tar) layers, and every file path: relative, no `..`, not
    absolute, unique, and no file also used as a directory.
    """
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ArtifactError(f"{source}: manifest is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{source}: manifest is not a JSON object")
    problems: list[str] = []
    if doc.get("mediaType") != MANIFEST_MEDIA_TYPE or doc.get("schemaVersion") != 2:
        problems.append(f"not an OCI image manifest (mediaType {doc.get('mediaType')!r})")
    if doc.get("artifactType") != ARTIFACT_TYPE:
        problems.append(f"artifactType {doc.get('artifactType')!r} is not {ARTIFACT_TYPE}")
    config = _descriptor(doc.get("config"), "config", problems)
    if config is not None and (
        config.get("mediaType") != CONFIG_MEDIA_TYPE or config["size"] > _MAX_CONFIG_BYTES
    ):
        problems.append(f"config: not a {CONFIG_MEDIA_TYPE} of at most {_MAX_CONFIG_BYTES} bytes")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not 0 < len(layers) <= _MAX_LAYERS:
        problems.append(f"layers: expected a list of 1 to {_MAX_LAYERS} descriptors")
        layers = []
    files = [f for i, layer in enumerate(layers) if (f := _file(layer, i, problems)) is not None]
    problems += _path_conflicts([f.path for f in files])
    if files and MANIFEST_NAME not in {f.path for f in files}:
        problems.append(f"no layer holds {MANIFEST_NAME}: not an ingot artifact")
    if problems or config is None:
        raise ArtifactError.from_problems(f"{source}: manifest refused", problems)
    return FileBlob("<config>", config["digest"], config["size"]), files


def model_config(manifest: Manifest, root: Path, diff_ids: list[str]) -> dict[str, Any]:
    """The ModelPack model config for an artifact (no timestamps: reproducible)."""
    hf = _hf_config(root)
    quant = manifest.model.quantization
    bits = {q.get("bits") for q in quant}
    precision = "fp32" if not quant else f"int{bits.pop()}" if len(bits) == 1 else "mixed"
    config: dict[str, Any] = {
        "architecture": "transformer",
        "format": "onnx",
        "precision": precision,
        "capabilities": {"inputTypes": ["text"], "outputTypes": ["text"]},
    }
    if quant:
        config["quantization"] = "+".join(sorted({str(q.get("method")) for q in quant}))
    params = _parameter_count(manifest, hf)
    if params:
        config["paramSize"] = _param_size(params)
    descriptor = {"name": manifest.name, "version": manifest.version}
    if isinstance(hf.get("model_type"), str):
        descriptor["family"] = hf["model_type"]
    return {
        "descriptor": descriptor,
        "config": config,
        "modelfs": {"type": "layers", "diffIds": diff_ids},
    }


# -- helpers -----------------------------------------------------------------------------------


def _layer(path: str, size: int, digest: str) -> dict[str, Any]:
    return {
        "mediaType": layer_media_type(path),
        "digest": digest,
        "size": size,
        "annotations": {FILEPATH: path, TITLE: path},
    }


def _descriptor(value: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        problems.append(f"{where}: not a descriptor object")
        return None
    digest, size = value.get("digest"), value.get("size")
    if not isinstance(digest, str) or not _is_sha256(digest):
        problems.append(f"{where}: digest {digest!r} is not sha256:<64 hex>")
        return None
    if type(size) is not int or size < 0:
        problems.append(f"{where}: size {size!r} is not a non-negative integer")
        return None
    return value


def _file(layer: Any, index: int, problems: list[str]) -> FileBlob | None:
    desc = _descriptor(layer, f"layers[{index}]", problems)
    if desc is None:
        return None
    annotations = desc.get("annotations") if isinstance(desc.get("annotations"), dict) else {}
    path = annotations.get(FILEPATH)
    if not isinstance(path, str):
        problems.append(f"layers[{index}]: no {FILEPATH} annotation")
        return None
    why = unsafe_path_reason(path)
    if why is not None:
        problems.append(f"{display_path(path)}: unsafe path: {why}")
        return None
    if annotations.get(TITLE, path) != path:
        problems.append(f"{path}: {TITLE} {annotations[TITLE]!r} disagrees with {FILEPATH}")
    if desc.get("mediaType") not in _RAW_TYPES:
        problems.append(
            f"{path}: media type {desc.get('mediaType')!r} is not a raw ModelPack layer "
            "(ingot never unpacks archives)"
        )
    return FileBlob(path, desc["digest"], desc["size"])


def _path_conflicts(paths: list[str]) -> list[str]:
    problems = sorted({f"{p}: listed more than once" for p in paths if paths.count(p) > 1})
    as_files = set(paths)
    for path in paths:
        parents = PurePosixPath(path).parents
        clash = next((str(d) for d in parents if str(d) in as_files), None)
        if clash is not None:
            problems.append(f"{path}: its directory {clash} is also a file")
    return problems


def _hf_config(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _parameter_count(manifest: Manifest, hf: dict[str, Any]) -> int | None:
    m = manifest.model
    inter = hf.get("intermediate_size")
    if type(inter) is not int:
        return None
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    per_layer = m.hidden_size * (2 * q_out + 2 * kv_out) + 3 * m.hidden_size * inter
    embeddings = m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    norms = (2 * m.num_layers + 1) * m.hidden_size
    return embeddings + m.num_layers * per_layer + norms


def _param_size(count: int) -> str:
    """ModelPack's `<count><scale>` with at most one decimal: 6.7B, 125M, 0.2M."""
    for scale, letter in ((1e15, "Q"), (1e12, "T"), (1e9, "B"), (1e6, "M")):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + letter
    return f"{count / 1e3:.1f}".removesuffix(".0") + "K"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + sha256_bytes(data)


def _is_sha256(digest: str) -> bool:
    return _SHA256.fullmatch(digest) is not None
