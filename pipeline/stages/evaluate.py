"""Stage: perplexity of the original model, the quantized IR and the engine that ships, on the
same token windows, and the IR's and the engine's mean per-token KL to the original; and the
mean accepted length of the recipe's speculative decoding.

The original and the IR are scored in torch; the engine (the artifact's first target, the
engine stage's output) as the runtime runs it (`evaluate/engine.py`), so an engine that
quantizes activations to int8 is measured as it will serve. Speculation runs through the
runtime's own Generator on that engine (and the draft model's engine of the same name),
`evaluate/speculative.py`. Both open the stage outputs through the runtime's loader
(runtime/loader.py): the export's graph interface, the engine's record and file, the drafter's
graphs, as a manifest would name them once packaged.

The key holds what is measured and how, not the gates (`judge_gates`, after the stage: a
changed `max_delta` or `min_accepted_length` re-judges without re-measuring), and the digest
of the whole runtime package's source: the runtime computes the numbers.
"""

from __future__ import annotations

import gc
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from ingot.runtime.loader import DrafterFiles, EngineFiles

from ..cache import code_digest
from ..engines import ENGINE_BUILDERS
from ..evaluate.engine import engine_perplexity
from ..evaluate.heads import quantized_heads, with_float_heads
from ..evaluate.markdown import render_markdown
from ..evaluate.perplexity import perplexity
from ..evaluate.reference import KLMeter, ReferenceLogits
from ..evaluate.report import check_perplexity_gate, perplexity_report, perplexity_summary
from ..evaluate.speculative import (
    SpeculativePrompts,
    check_speculative_gate,
    measure_speculation,
    speculative_summary,
)
from ..evaluate.windows import EvalWindows
from ..model.config import ModelConfig
from ..model.load import load_model
from ..quantize.checkpoint import load_ir
from .eagle import EagleOutput
from .heads import HeadsOutput
from .model import ModelStages
from .prepare import BuildInputs, source_digest
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["EvaluateOutput", "Measured", "evaluate_stage", "judge_gates", "run_evaluate"]


@dataclass(frozen=True, slots=True)
class EvaluateOutput(StageOutput):
    """``report.json`` (the measurements) and ``report.md``, shipped as is under eval/."""

    REPORT: ClassVar[str] = "report.json"
    MARKDOWN: ClassVar[str] = "report.md"

    def report(self) -> dict[str, Any]:
        return self._json(self.REPORT)


@dataclass(frozen=True, slots=True)
class Measured:
    """What the stage measures, read from the stage outputs: the float checkpoint (and its
    tokenizer), the IR, the first target's engine and the drafter as the runtime opens them;
    the model's config and exported max_seq_len (for speculation)."""

    source: Path
    ir: Path
    engine: EngineFiles
    drafter: DrafterFiles
    cfg: ModelConfig
    max_seq_len: int


def evaluate_stage(
    inputs: BuildInputs,
    target: ModelStages,
    draft: ModelStages | None = None,
    heads: Stage[HeadsOutput] | None = None,
    eagle: Stage[EagleOutput] | None = None,
) -> Stage[EvaluateOutput]:
    """The evaluate stage: perplexity with `inputs.evaluation`, speculation with
    `inputs.speculative` (drafting with the `draft` model's engine of the first target's
    name, the Medusa `heads` or the `eagle` draft, by the recipe's method)."""
    # The engine scored is the first target's: the one the runtime prefers (and the draft
    # model's engine of that name: the one the runtime pairs with it).
    first = target.first_engine
    key_slice: dict[str, Any] = {"engine": first}
    keyed: dict[str, Input] = {
        "engine": target.engines[first],
        "source": source_digest(inputs.source),
    }
    evaluation, speculative = inputs.evaluation, inputs.speculative
    if evaluation is not None:
        # max_delta is left out of the key: changing the gate re-judges, it does not re-measure.
        key_slice["perplexity"] = evaluation.spec.model_dump(mode="json", exclude={"max_delta"})
        keyed |= {"quantize": target.quantize, "dataset": evaluation.digest}
    drafter = _Drafter()
    if speculative is not None:
        key_slice["speculative"] = speculative.key_slice()
        keyed["speculative_dataset"] = speculative.digest
        drafter = _Drafter.declare(speculative.method.method, first, draft, heads, eagle)
        keyed |= drafter.inputs()
    keyed["runtime"] = runtime_digest()
    # Read, not keyed: the graph interface the engine was built from (graph.json), which the
    # runtime opens it with (the engine's digest covers it); the IR is keyed when scored.
    reads = (target.export, target.quantize, *drafter.reads())

    def produce(job: StageJob) -> None:
        engine = job[target.engines[first]].files(job[target.export])
        max_seq_len = inputs.recipe.export.max_seq_len
        ir = job[target.quantize].dir
        measured = Measured(
            inputs.source.path, ir, engine, drafter.files(job), inputs.cfg, max_seq_len
        )
        run_evaluate(job.out, measured, evaluation, speculative)

    return Stage("evaluate", EvaluateOutput, key_slice, keyed, produce, reads)


def runtime_digest() -> str:
    """sha256 of every module of the runtime package (`code_digest`): it computes the
    stage's numbers, and is not in `tool_versions`' build-code digest (a runtime edit must not
    re-key every stage)."""
    return "sha256:" + code_digest("ingot.runtime")


@dataclass(frozen=True, slots=True)
class _Drafter:
    """What the measured method drafts with, as stages: a draft model's engine (and its
    export, read for its graph interface), the Medusa heads or the EAGLE-3 draft; none for
    ngram (prompt lookup) or without speculation."""

    method: str | None = None
    stage: Stage[Any] | None = None
    export: Stage[Any] | None = None  # the draft model's, for draft_model

    _INPUTS: ClassVar[dict[str, str]] = {
        "draft_model": "draft_engine",
        "medusa": "heads",
        "eagle": "eagle",
    }

    @classmethod
    def declare(
        cls,
        method: str,
        engine: str,
        draft: ModelStages | None,
        heads: Stage[HeadsOutput] | None,
        eagle: Stage[EagleOutput] | None,
    ) -> _Drafter:
        if method == "draft_model" and draft is not None:
            return cls(method, draft.engines[engine], draft.export)
        stage = {"medusa": heads, "eagle": eagle}.get(method)
        if method in cls._INPUTS and stage is None:
            raise ValueError(f"speculative method {method}: no drafter stage to measure")
        return cls(method, stage)

    def inputs(self) -> dict[str, Input]:
        return {self._INPUTS[self.method]: self.stage} if self.stage is not None else {}

    def reads(self) -> tuple[Stage[Any], ...]:
        return (self.export,) if self.export is not None else ()

    def files(self, job: StageJob) -> DrafterFiles:
        """The drafter's files as the runtime opens them (a manifest's `speculative` names
        the same files once packaged)."""
        if self.method == "draft_model":
            return DrafterFiles(draft=job[self.stage].files(job[self.export]))
        if self.method == "medusa":
            return DrafterFiles(heads=job[self.stage].graph)
        if self.method == "eagle":
            eagle = job[self.stage]
            return DrafterFiles(eagle=(eagle.dir, eagle.info()))
        return DrafterFiles()


def run_evaluate(
    out: Path,
    measured: Measured,
    windows: EvalWindows | None,
    speculative: SpeculativePrompts | None,
) -> None:
    """Write report.json and report.md (measurements only: the gates are the build's call, so
    changing `max_delta` or `min_accepted_length` re-uses this stage): perplexity on
    `windows`, speculation on the `speculative` prompts."""
    engine = measured.engine
    report = {}
    if windows is not None:
        report["perplexity"] = _perplexity(out, measured.source, measured.ir, engine, windows)
    if speculative is not None:
        cfg = measured.cfg
        report["speculative"] = measure_speculation(
            speculative,
            engine,
            measured.drafter,
            measured.source / "tokenizer.json",
            max_seq_len=measured.max_seq_len,
            sliding_window=cfg.sliding_window,
            vocab_size=cfg.vocab_size,
            eos_token_ids=tuple(cfg.eos_token_ids),
        )
        gc.collect()
    builder = ENGINE_BUILDERS.get(engine.engine.engine)
    label = builder.describe(engine.engine.model_dump(mode="json"), engine.path.parent)
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    (out / EvaluateOutput.REPORT).write_text(text)
    (out / EvaluateOutput.MARKDOWN).write_text(render_markdown(report, label))


def judge_gates(output: EvaluateOutput | None, inputs: BuildInputs) -> dict[str, Any]:
    """The recipe's gates on the measured report, judged after the stage and before packaging
    (a failure keeps the previous artifact and every cached stage); the manifest's `eval`
    summaries of what passed."""
    if output is None:
        return {}
    report, fields = output.report(), {}
    if inputs.evaluation is not None:
        max_delta = inputs.evaluation.spec.max_delta
        check_perplexity_gate(report, max_delta)
        fields["perplexity"] = perplexity_summary(report, max_delta)
    if inputs.speculative is not None:
        threshold = inputs.speculative.spec.min_accepted_length
        check_speculative_gate(report, threshold)
        fields["speculative"] = speculative_summary(report, threshold)
    return fields


def _perplexity(
    out: Path, source_path: Path, ir_dir: Path, engine: EngineFiles, evaluation: EvalWindows
):
    windows, spec = evaluation.windows, evaluation.spec
    count, length = windows.shape
    # The original's logits go to disk (evaluate/reference.py), for the IR's and the engine's
    # mean KL to them; the scratch directory is gone before the stage's output is stored.
    with tempfile.TemporaryDirectory(prefix="reference-", dir=out) as scratch:
        # One model in memory at a time: evaluation must not double the build's peak.
        model = load_model(source_path)
        vocab = model.cfg.vocab_size
        reference = ReferenceLogits(Path(scratch) / "logits.npy", count, length, vocab)
        original = perplexity(model, windows, on_logits=reference.write)
        del model
        gc.collect()
        model = load_ir(ir_dir)
        quantized_kl = KLMeter(reference)
        quantized = perplexity(model, windows, on_logits=quantized_kl.add)
        heads = quantized_heads(model)
        float_heads = None  # the IR with a float embedding and lm_head: what they cost
        if heads:
            float_heads = perplexity(with_float_heads(model, source_path), windows)
        # The engine's mask applies the model's window, as the IR's does.
        engine = replace(engine, sliding_window=model.cfg.sliding_window)
        del model
        gc.collect()
        engine_kl = KLMeter(reference)
        engine_ppl = engine_perplexity(engine, windows.numpy(), on_logits=engine_kl.add)
        del reference
        gc.collect()
    return perplexity_report(
        dataset=spec.dataset,
        dataset_sha256=evaluation.digest,
        seq_len=spec.seq_len,
        windows=int(count),
        original=original,
        quantized=quantized,
        engine=engine_ppl,
        kl=quantized_kl.mean(),
        engine_kl=engine_kl.mean(),
        engine_name=engine.engine.name,
        # The report's field since ONNX Runtime was the only engine (None for an engine
        # without MatMulNBits levels); report.md describes the engine through its plug-in.
        matmul_accuracy_level=engine.engine.build.get("matmul_accuracy_level"),
        float_heads=None if float_heads is None else (heads, float_heads),
    )
