"""The top-level Recipe (all sections together), which sections each build stage reads, and
the recipe's JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from .artifact import Artifact
from .base import JSON_SCHEMA_DIALECT, _Strict
from .calibration import Calibration
from .evaluate import Evaluate
from .export import Export, KvCache
from .interop import InteropFormat, _check_unique_formats
from .quantize import Quantize
from .source import Source
from .speculative import Draft, Speculative
from .targets import DEFAULT_TARGETS, Target, _check_unique_targets, target_problems

__all__ = ["STAGES", "Recipe", "recipe_json_schema"]


class Recipe(_Strict):
    """An ingot recipe: source checkpoint -> quantized, exported, engine-built artifact."""

    source: Source = Field(description="Where the checkpoint comes from.")
    calibration: Calibration | None = Field(
        default=None, description="Calibration data (needed by activation-aware methods)."
    )
    quantize: list[Quantize] = Field(
        default=[], description="Quantization passes; each module is quantized by at most one."
    )
    embedding_and_lm_head: Literal["auto", "float"] = Field(
        default="auto",
        description="When no quantize entry selects embed_tokens or lm_head: auto quantizes "
        "both (rtn int8, one scale per row) for a source of 1e9 parameters or more, or of "
        "1e8 or more whose embedding and lm_head are a quarter of its parameters or more, "
        "whose recipe quantizes anything, and keeps them float otherwise; float keeps them "
        "float.",
    )
    kv_cache: KvCache = Field(default=KvCache(), description="Paged KV cache layout.")
    export: Export = Field(default=Export(), description="ONNX export settings.")
    targets: Annotated[list[Target], AfterValidator(_check_unique_targets)] = Field(
        default=DEFAULT_TARGETS,
        min_length=1,
        description="Engines to build; the runtime picks the first one the host can run.",
    )
    evaluate: Evaluate | None = Field(
        default=None, description="Evaluation of the quantized model (report and gate)."
    )
    interop: Annotated[list[InteropFormat], AfterValidator(_check_unique_formats)] = Field(
        default=[],
        description="Extra checkpoints written to the artifact's interop/<format>/ for other "
        "engines: GPTQ v1 (gptq), AWQ GEMM (awq), compressed-tensors pack-quantized, and a GGUF "
        "file for llama.cpp (gguf).",
    )
    speculative: Speculative | None = Field(
        default=None,
        description="Speculative decoding: the runtime's default method, recorded in the "
        "manifest; method draft_model also builds the draft model into the artifact's draft/, "
        "method medusa its heads into draft/heads/, method eagle its draft layer into "
        "draft/eagle/.",
    )
    artifact: Artifact = Field(description="Name and version of the result.")

    @model_validator(mode="after")
    def _calibration_for_calibrated_methods(self) -> Recipe:
        needing = [
            f"{path}.{i} (method {q.method})"
            for path, entries in self.quantize_lists().items()
            for i, q in enumerate(entries)
            if q.calibrated
        ]
        if needing and self.calibration is None:
            raise PydanticCustomError(
                "calibration_missing",
                "calibration: required field missing: {needing} needs calibration data "
                "(add a `calibration:` section with dataset, samples, seq_len)",
                {"needing": ", ".join(needing)},
            )
        return self

    @model_validator(mode="after")
    def _calibration_for_trained_heads(self) -> Recipe:
        # The heads (or the EAGLE-3 layer) learn from the target's hidden states on the
        # calibration windows.
        if not self.trains_heads():
            return self
        what = "an EAGLE-3 draft" if self.speculative.method == "eagle" else "Medusa heads"
        if self.calibration is None:
            raise PydanticCustomError(
                "calibration_missing",
                "speculative.heads.train: needs calibration data, the text {what} is trained "
                "on (add a `calibration:` section with dataset, samples, seq_len)",
                {"what": what},
            )
        if self.calibration.samples < 2:
            raise PydanticCustomError(
                "calibration_samples",
                "calibration.samples: {n} is too few to train {what} (at least 2: a tenth of "
                "the windows, at least one, is held out to score it)",
                {"n": self.calibration.samples, "what": what},
            )
        train, seq_len = self.speculative.heads.train, self.calibration.seq_len
        if self.speculative.method == "eagle":
            if train.span > seq_len:
                raise PydanticCustomError(
                    "calibration_seq_len",
                    "speculative.heads.train.span: {span} exceeds calibration.seq_len {t} "
                    "(a span is cut from one window)",
                    {"span": train.span, "t": seq_len},
                )
        elif seq_len <= train.num_heads + 1:
            raise PydanticCustomError(
                "calibration_seq_len",
                "calibration.seq_len: {t} is too short for {k} Medusa heads (more than k + 1 "
                "tokens per window: head k learns from the token k + 1 positions on)",
                {"t": seq_len, "k": train.num_heads},
            )
        return self

    @model_validator(mode="after")
    def _calibration_for_quantized_kv(self) -> Recipe:
        # Its per-head K/V scales are measured on the calibration windows.
        if self.kv_cache.quantized and self.calibration is None:
            raise PydanticCustomError(
                "calibration_missing",
                "kv_cache.dtype: {dtype} needs calibration data for its per-head K/V scales "
                "(add a `calibration:` section with dataset, samples, seq_len, or use fp16)",
                {"dtype": self.kv_cache.dtype},
            )
        return self

    @model_validator(mode="after")
    def _targets_run_the_recipe(self) -> Recipe:
        # What an engine cannot run (a KV layout, a weight format) is refused here, before any
        # stage, rather than failing the engine's build an hour in.
        problems = target_problems(self)
        if problems:
            raise PydanticCustomError(
                "engine_target", "{problems}", {"problems": "; ".join(problems)}
            )
        return self

    @model_validator(mode="after")
    def _speculative_evaluation_fits(self) -> Recipe:
        """evaluate.speculative measures the `speculative` section, on text it can find, in
        sequences the engine holds, against a threshold it can reach."""
        spec = self.evaluate.speculative if self.evaluate is not None else None
        if spec is None:
            return self
        where = "evaluate.speculative"
        problem = None
        explicit = spec.model_fields_set & {"split", "text_field"}
        if self.speculative is None:
            problem = (
                f"{where}: needs a `speculative` section to measure (it evaluates the recipe's "
                "speculative decoding: add `speculative: {method: ngram, "
                "num_speculative_tokens: 4}` or a draft_model)"
            )
        elif spec.dataset is None and self.evaluate.perplexity is None:
            problem = (
                f"{where}.dataset: required field missing (there is no evaluate.perplexity "
                "dataset to default to)"
            )
        elif spec.dataset is None and explicit:
            field = sorted(explicit)[0]
            problem = (
                f"{where}.{field}: only with {where}.dataset (without it the text is "
                "evaluate.perplexity's, its split and text_field included)"
            )
        elif spec.prompt_tokens + spec.max_tokens > self.export.max_seq_len:
            problem = (
                f"{where}: prompt_tokens + max_tokens = {spec.prompt_tokens + spec.max_tokens} "
                f"exceeds export.max_seq_len {self.export.max_seq_len}"
            )
        elif (
            spec.min_accepted_length is not None
            and spec.min_accepted_length > self.speculative.num_speculative_tokens + 1
        ):
            problem = (
                f"{where}.min_accepted_length: {spec.min_accepted_length:g} can never be met "
                f"(at most num_speculative_tokens + 1 = "
                f"{self.speculative.num_speculative_tokens + 1} tokens per verification)"
            )
        if problem is not None:
            raise PydanticCustomError("evaluate_speculative", "{problem}", {"problem": problem})
        return self

    def trains_heads(self) -> bool:
        """Whether the build trains Medusa heads or an EAGLE-3 draft (on the calibration
        windows)."""
        heads = getattr(self.speculative, "heads", None)
        return heads is not None and heads.train is not None

    def draft(self) -> Draft | None:
        """The draft model to build (`speculative.draft`, method draft_model), or None."""
        return getattr(self.speculative, "draft", None)

    def draft_quantize(self) -> list[Quantize]:
        """The draft model's quantize entries: its own list, else the target's."""
        draft = self.draft()
        if draft is None:
            raise ValueError("the recipe builds no draft model")
        return self.quantize if draft.quantize is None else draft.quantize

    def quantize_lists(self) -> dict[str, list[Quantize]]:
        """{recipe path: quantize entries} of every model the recipe builds: the target's
        `quantize`, and a draft model's own `speculative.draft.quantize` when it has one."""
        lists = {"quantize": self.quantize}
        draft = self.draft()
        if draft is not None and draft.quantize is not None:
            lists["speculative.draft.quantize"] = draft.quantize
        return lists

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
