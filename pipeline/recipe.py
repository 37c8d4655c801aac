"""The recipe: one declarative YAML file that says how to build an artifact.

Every model forbids unknown keys (a typo must not silently fall back to a default) and is strict
(YAML already gives typed values, so "4" for `bits` is a mistake, not something to coerce).
Checks that need the source model's config.json live in `recipe_checks.py`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .recipe_errors import RecipeError, format_validation_error

__all__ = [
    "Artifact",
    "ArtifactSign",
    "AwqQuantize",
    "CALIBRATED_METHODS",
    "Calibration",
    "Evaluate",
    "Export",
    "GptqQuantize",
    "HubSource",
    "InteropFormat",
    "KvCache",
    "LocalSource",
    "OnnxRuntimeTarget",
    "Perplexity",
    "Recipe",
    "RecipeError",
    "Quantize",
    "RtnQuantize",
    "STAGES",
    "Source",
    "Target",
    "load_recipe",
    "recipe_json_schema",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# -- source ------------------------------------------------------------------------------------


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


# -- calibration -------------------------------------------------------------------------------


class Calibration(_Strict):
    """Text the activation-aware quantizers run through the model (RTN does not use it)."""

    dataset: str = Field(
        min_length=1, description="Hub dataset id, or a local .txt / .jsonl / .parquet file."
    )
    split: str = Field(default="train", min_length=1, description="Dataset split to sample.")
    text_field: str = Field(
        default="text", min_length=1, description="Column (or JSON key) holding the text."
    )
    samples: int = Field(default=128, gt=0, description="Number of calibration sequences.")
    seq_len: int = Field(default=512, ge=16, description="Tokens per calibration sequence.")
    seed: int = Field(default=0, ge=0, description="Seed for choosing the samples.")


# -- quantize ----------------------------------------------------------------------------------


def _check_module_pattern(pattern: str) -> str:
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as exc:
            raise PydanticCustomError(
                "bad_regex", "invalid regular expression: {reason}", {"reason": str(exc)}
            ) from None
    return pattern


ModulePattern = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(_check_module_pattern),
]


class RtnQuantize(_Strict):
    """Round-to-nearest weight quantization: no calibration data, the fast baseline."""

    method: Literal["rtn"] = Field(description="Quantization algorithm.")
    bits: Literal[4, 8] = Field(description="Bits per weight.")
    group_size: Literal[32, 64, 128, -1] = Field(
        description="Input channels sharing one scale; -1 = one scale per output channel.",
    )
    symmetric: bool = Field(
        default=True, description="Symmetric (zero point 0) or asymmetric (with zero points)."
    )
    targets: list[ModulePattern] = Field(
        default=["re:.*"],
        min_length=1,
        description="Modules to quantize: IR module names (`layers.0.attn.q_proj`, `lm_head`) "
        "or regular expressions prefixed `re:` that must match the whole name.",
    )
    ignore: list[ModulePattern] = Field(
        default=["lm_head"],
        description="Modules to leave unquantized, even if `targets` selects them "
        "(same syntax as `targets`).",
    )


class GptqQuantize(_Strict):
    """GPTQ: rounds column by column, each column's error absorbed by the columns not yet
    quantized (weighted by the inverse Hessian of the calibration inputs). Needs `calibration`."""

    method: Literal["gptq"] = Field(description="Quantization algorithm.")
    bits: Literal[4, 8] = Field(description="Bits per weight.")
    group_size: Literal[32, 64, 128, -1] = Field(
        description="Input channels sharing one scale; -1 = one scale per output channel.",
    )
    symmetric: bool = Field(
        default=True, description="Symmetric (zero point 0) or asymmetric (with zero points)."
    )
    targets: list[ModulePattern] = Field(
        default=["re:.*"], min_length=1, description=RtnQuantize.model_fields["targets"].description
    )
    ignore: list[ModulePattern] = Field(
        default=["lm_head"], description=RtnQuantize.model_fields["ignore"].description
    )
    actorder: bool = Field(
        default=True,
        description="Visit input channels in order of decreasing activation energy (diag of "
        "the Hessian). Needs static_groups (except per channel) so groups stay contiguous and "
        "the export needs no permutation.",
    )
    static_groups: bool = Field(
        default=True,
        description="Compute each group's scale and zero point from the original weights up "
        "front (contiguous channels) rather than when GPTQ reaches the group.",
    )
    dampening_frac: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="Added to the Hessian's diagonal, as a fraction of its mean.",
    )
    block_size: int = Field(
        default=128, ge=1, le=4096, description="Columns per lazy batch update."
    )
    true_sequential: bool = Field(
        default=False,
        description="Fit each group of a layer (q,k,v -> o -> gate,up -> down) to the inputs "
        "the already quantized groups before it produce, instead of observing every group "
        "on the layer as loaded.",
    )

    @field_validator("static_groups")
    @classmethod
    def _static_groups_with_actorder(cls, value: bool, info: ValidationInfo) -> bool:
        if not value and info.data.get("actorder") and info.data.get("group_size") != -1:
            raise PydanticCustomError(
                "actorder_dynamic_groups",
                "actorder with dynamic groups scatters each group over the input channels "
                "(a g_idx) that the ONNX export cannot represent; keep static_groups: true "
                "(act order without the run-time cost) or set actorder: false",
            )
        return value


class AwqQuantize(_Strict):
    """AWQ: per-channel scales from activation magnitudes, folded into the preceding norm or
    linear, plus a clipping search; W4 weight-only. Needs `calibration`."""

    method: Literal["awq"] = Field(description="Quantization algorithm.")
    bits: Literal[4] = Field(description="Bits per weight.")
    group_size: Literal[32, 64, 128, -1] = Field(
        description="Input channels sharing one scale; -1 = one scale per output channel.",
    )
    symmetric: bool = Field(
        default=False,
        description="Symmetric (zero point 0) or asymmetric (with zero points, AWQ's usual).",
    )
    targets: list[ModulePattern] = Field(
        default=["re:.*"], min_length=1, description=RtnQuantize.model_fields["targets"].description
    )
    ignore: list[ModulePattern] = Field(
        default=["lm_head"], description=RtnQuantize.model_fields["ignore"].description
    )


# Discriminated by `method`: an unknown method fails with the list of known ones.
Quantize = Annotated[RtnQuantize | GptqQuantize | AwqQuantize, Field(discriminator="method")]
CALIBRATED_METHODS = ("gptq", "awq")


# -- kv cache, export --------------------------------------------------------------------------


class KvCache(_Strict):
    """The paged KV cache the runtime allocates; the exported graph reads it by block table."""

    dtype: Literal["fp32", "fp16"] = Field(default="fp32", description="Element type of K/V.")
    block_size: Literal[1, 2, 4, 8, 16, 32, 64, 128, 256] = Field(
        default=16, description="Tokens per KV block (a power of two, 1..256)."
    )


class Export(_Strict):
    """The ONNX graph: standard operators, fused attention."""

    opset: Literal[23] = Field(default=23, description="ONNX opset (23: fused `Attention`).")
    max_seq_len: int = Field(
        default=2048, ge=16, description="Longest sequence (prompt + output) the artifact serves."
    )
    fused_attention: Literal[True] = Field(
        default=True, description="Export attention as the op-23 `Attention` operator."
    )
    dtype: Literal["fp32"] = Field(
        default="fp32", description="Element type of activations and unquantized weights."
    )


# -- engine targets ----------------------------------------------------------------------------


class OnnxRuntimeTarget(_Strict):
    """ONNX Runtime; the graph is optimized at build time and loaded as is by the runtime."""

    engine: Literal["onnxruntime"] = Field(description="Inference engine.")
    device: Literal["cpu"] = Field(default="cpu", description="Execution provider's device.")
    optimization_level: Literal["basic", "extended", "all"] = Field(
        default="extended",
        description=(
            "ORT graph optimization level applied at build time. 'extended' fuses attention, "
            "norms and int4/int8 DequantizeLinear+MatMul into MatMulNBits and stays portable; "
            "'all' adds layout transforms tied to the build host's CPU ISA, which the manifest "
            "then requires of every host."
        ),
    )
    intra_op_num_threads: int = Field(
        default=0, ge=0, description="Threads per operator; 0 lets ONNX Runtime choose."
    )
    matmul_accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        default=0,
        description=(
            "Compute type of ORT's fused MatMulNBits: 0 keeps fp32 activations (the exported "
            "graph's numbers, checked against the IR); 4 quantizes activations to int8 inside "
            "the kernel: faster (much faster for int8 weights on CPU), but no longer the "
            "graph's exact numbers."
        ),
    )


Target = Annotated[OnnxRuntimeTarget, Field(discriminator="engine")]


def _check_unique_targets(targets: list[OnnxRuntimeTarget]) -> list[OnnxRuntimeTarget]:
    # Each target gets its own engines/<engine>-<device>/ directory in the artifact.
    seen: dict[tuple[str, str], int] = {}
    for index, target in enumerate(targets):
        key = (target.engine, target.device)
        if key in seen:
            raise PydanticCustomError(
                "duplicate_target",
                "targets {first} and {second} are both {engine} on {device}",
                {"first": seen[key], "second": index, "engine": key[0], "device": key[1]},
            )
        seen[key] = index
    return targets


# -- evaluate, interop -------------------------------------------------------------------------


class Perplexity(_Strict):
    """Perplexity of the original and the quantized model on the same fixed token windows."""

    dataset: str = Field(
        min_length=1,
        description="Local .txt / .jsonl / .parquet / .arrow file (relative to the recipe file) "
        "or a Hub dataset id. Documents are joined with blank lines and tokenized with the "
        "checkpoint's tokenizer.json (no special tokens).",
    )
    split: str = Field(default="train", min_length=1, description="Split of a Hub dataset.")
    text_field: str = Field(
        default="text", min_length=1, description="Column (or JSON key) holding the text."
    )
    seq_len: int = Field(
        default=256,
        ge=16,
        description="Tokens per window. Windows are consecutive and non-overlapping; each is "
        "scored on its seq_len - 1 next-token predictions.",
    )
    max_windows: int | None = Field(
        default=None, gt=0, description="Evaluate only the first N windows (None: all)."
    )
    max_delta: float | None = Field(
        default=None,
        ge=0,
        description="Gate: fail the build (before packaging) when quantized minus original "
        "perplexity exceeds this. None: report only.",
    )


class Evaluate(_Strict):
    """Quality checks of the quantized model, reported in the artifact's eval/."""

    perplexity: Perplexity | None = Field(
        default=None, description="Perplexity before and after quantization."
    )


InteropFormat = Literal["gptq", "awq", "compressed-tensors"]


def _check_unique_formats(formats: list[str]) -> list[str]:
    repeated = sorted({f for f in formats if formats.count(f) > 1})
    if repeated:
        raise PydanticCustomError(
            "duplicate_format", "{formats} listed more than once", {"formats": repeated}
        )
    return formats


# -- artifact ----------------------------------------------------------------------------------


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


# -- the recipe --------------------------------------------------------------------------------


class Recipe(_Strict):
    """An ingot recipe: source checkpoint -> quantized, exported, engine-built artifact."""

    source: Source = Field(description="Where the checkpoint comes from.")
    calibration: Calibration | None = Field(
        default=None, description="Calibration data (needed by activation-aware methods)."
    )
    quantize: list[Quantize] = Field(
        default=[], description="Quantization passes; each module is quantized by at most one."
    )
    kv_cache: KvCache = Field(default=KvCache(), description="Paged KV cache layout.")
    export: Export = Field(default=Export(), description="ONNX export settings.")
    targets: Annotated[list[Target], AfterValidator(_check_unique_targets)] = Field(
        default=[OnnxRuntimeTarget(engine="onnxruntime")],
        min_length=1,
        description="Engines to build; the runtime picks the first one the host can run.",
    )
    evaluate: Evaluate | None = Field(
        default=None, description="Evaluation of the quantized model (report and gate)."
    )
    interop: Annotated[list[InteropFormat], AfterValidator(_check_unique_formats)] = Field(
        default=[],
        description="Extra checkpoints written to the artifact's interop/<format>/ for other "
        "engines: GPTQ v1 (gptq), AWQ GEMM (awq), compressed-tensors pack-quantized.",
    )
    artifact: Artifact = Field(description="Name and version of the result.")

    @model_validator(mode="after")
    def _calibration_for_calibrated_methods(self) -> Recipe:
        needing = [
            f"quantize.{i} (method {q.method})"
            for i, q in enumerate(self.quantize)
            if q.method in CALIBRATED_METHODS
        ]
        if needing and self.calibration is None:
            raise PydanticCustomError(
                "calibration_missing",
                "calibration: required field missing: {needing} needs calibration data "
                "(add a `calibration:` section with dataset, samples, seq_len)",
                {"needing": ", ".join(needing)},
            )
        return self

    def stage_slice(self, stage: str) -> dict[str, Any]:
        """The JSON-able part of the recipe that build stage `stage` depends on (its cache key)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r} (allowed: {', '.join(STAGES)})")
        return self.model_dump(mode="json", include=set(STAGES[stage]))


# Which recipe sections each build stage reads; a change elsewhere does not invalidate it.
STAGES: dict[str, tuple[str, ...]] = {
    "source": ("source",),
    "calibrate": ("calibration",),
    "quantize": ("quantize",),
    "export": ("export", "kv_cache"),
    "engine": ("targets",),
    "interop": ("interop",),
    "evaluate": ("evaluate",),
    "package": ("artifact",),
}


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe, for editors; checked in as recipes/recipe.schema.json."""
    return {"$schema": JSON_SCHEMA_DIALECT, **Recipe.model_json_schema()}


# -- loading -----------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice is an error instead of last-one-wins."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read and validate a recipe file; raises RecipeError listing every problem found."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([f"{file}: no such recipe file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([f"{file}: cannot read recipe: {exc}"]) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise RecipeError([f"{file}: not valid YAML: {where}{exc.problem}"]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([f"{file}: not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise RecipeError([f"{file}: a recipe must be a YAML mapping of sections (got {kind})"])
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, file, Recipe)) from None
    return _resolve_source_path(recipe, Path(path).absolute().parent)


def _resolve_source_path(recipe: Recipe, recipe_dir: Path) -> Recipe:
    # A recipe names its checkpoint relative to itself, so it builds from any working directory.
    if not isinstance(recipe.source, LocalSource):
        return recipe
    resolved = os.path.normpath(recipe_dir / os.path.expanduser(recipe.source.path))
    source = recipe.source.model_copy(update={"path": resolved})
    return recipe.model_copy(update={"source": source})
