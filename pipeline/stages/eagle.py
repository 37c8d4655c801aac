"""Stage: an EAGLE-3 draft (speculative.method: eagle), trained against the quantize stage's
IR on the calibration windows or attached from a speculators checkpoint, exported to ONNX and
checked.

Writes ``model.onnx`` (+ ``.data``: the draft layer), ``fc.onnx`` (+ ``.data``: the target's
aux states to the draft's hidden size), ``speculators/`` (the draft in the speculators format,
loadable by vLLM and usable as `attach`) and ``eagle.json`` (origin, sizes, aux layers, the
training report, the graphs' check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ingot.artifacts.manifest import EagleInfo
from ingot.calibration.dataset import CalibrationSet

from ..heads.eagle_attach import AttachedEagle
from ..heads.eagle_export import FC_FILE, MODEL_FILE, check_eagle, export_eagle
from ..heads.eagle_train import target_features, train_eagle
from ..model.eagle3 import (
    Eagle3Draft,
    Eagle3Error,
    check_aux_layers,
    default_aux_layers,
    load_eagle3,
    save_eagle3,
)
from ..model.llama import scale_embedding
from ..quantize.ir_layers import IRLayers
from ..recipe import EagleHeads, Recipe, RecipeError
from .calibrate import Calibrated
from .quantize import QuantizeOutput
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["EagleOutput", "eagle_aux_layers", "eagle_stage", "run_eagle"]

_CHECK_TOKENS = 48  # positions the exported graphs are checked on


@dataclass(frozen=True, slots=True)
class EagleOutput(StageOutput):
    """``model.onnx`` (the draft layer) and ``fc.onnx`` (the target's aux states to the
    draft's width), each with its ``.data`` (what the artifact ships), ``speculators/`` (the
    draft in the speculators format) and ``eagle.json`` (origin, sizes, aux layers, training,
    check)."""

    GRAPH: ClassVar[str] = MODEL_FILE
    FC: ClassVar[str] = FC_FILE
    SHIPPED: ClassVar[tuple[str, ...]] = (
        MODEL_FILE,
        f"{MODEL_FILE}.data",
        FC_FILE,
        f"{FC_FILE}.data",
    )
    SPECULATORS: ClassVar[str] = "speculators"
    RECORD: ClassVar[str] = "eagle.json"

    def record(self) -> dict[str, Any]:
        return self._json(self.RECORD)

    def info(self) -> EagleInfo:
        """The draft as the runtime opens it, its graphs' paths relative to `dir` (a
        manifest's `speculative.eagle` names the same files, under draft/eagle/)."""
        paths = {"method": "eagle", "path": self.GRAPH, "fc_path": self.FC}
        return EagleInfo.model_validate({**self.record(), **paths})


def eagle_stage(
    recipe: Recipe,
    quantize: Stage[QuantizeOutput],
    calibrated: Calibrated | None,
    attached: AttachedEagle | None,
    verifier: str,
) -> Stage[EagleOutput]:
    """The EAGLE-3 stage: keyed by the quantized target (its embedding feeds the draft, and a
    trained draft learns from it) and an attached checkpoint's files' digest, or the
    calibration windows a trained draft learns on (resumable). `verifier` is written into
    the speculators config.json."""
    spec = recipe.speculative.heads
    shape = {
        "max_seq_len": recipe.export.max_seq_len,
        "kv_block_size": recipe.kv_cache.block_size,
        "num_speculative_tokens": recipe.speculative.num_speculative_tokens,
        "verifier": verifier,
    }
    key_slice = {"eagle": spec.model_dump(mode="json", exclude={"attach"}), **shape}
    inputs: dict[str, Input] = {"quantize": quantize}
    if attached is not None:
        return Stage(
            "eagle",
            EagleOutput,
            key_slice,
            {**inputs, "attach": attached.digest},
            lambda job: run_eagle(
                spec, job.out, ir_dir=job[quantize].dir, attached=attached, **shape
            ),
        )
    if calibrated is None:
        raise ValueError("eagle: training needs the calibrate stage")
    key_slice["calibration"] = calibrated.key_slice
    c = calibrated.stage

    def train(job: StageJob) -> None:
        run_eagle(
            spec,
            job.out,
            ir_dir=job[quantize].dir,
            calibration_dir=job[c].dir,
            work_dir=job.work,
            **shape,
        )

    return Stage(
        "eagle", EagleOutput, key_slice, inputs | calibrated.inputs(), train, resumable=True
    )


def eagle_aux_layers(
    spec: EagleHeads, num_layers: int, attached: AttachedEagle | None
) -> tuple[int, int, int]:
    """The target layers whose entering residual streams feed the draft: the attached
    checkpoint's (checked when it was resolved), the recipe's train.aux_layers, else the
    default (`default_aux_layers`). RecipeError naming the field when they cannot serve."""
    if attached is not None:
        return attached.cfg.aux_layers
    where = "speculative.heads.train.aux_layers"
    try:
        if spec.train is not None and spec.train.aux_layers is not None:
            check_aux_layers(spec.train.aux_layers, num_layers, where)
            return tuple(spec.train.aux_layers)
        return default_aux_layers(num_layers)
    except Eagle3Error as e:
        raise RecipeError([f"{where}: {e}" if where not in str(e) else str(e)]) from None


def run_eagle(
    spec: EagleHeads,
    out: Path,
    *,
    ir_dir: Path,
    max_seq_len: int,
    kv_block_size: int,
    num_speculative_tokens: int,
    verifier: str,
    attached: AttachedEagle | None = None,
    calibration_dir: Path | None = None,
    work_dir: Path | None = None,
) -> None:
    """Train (``spec.train``: on ``ir_dir``'s model over ``calibration_dir``'s windows,
    checkpointing in ``work_dir``) or load (``attached``) the draft, then export and check."""
    source = IRLayers(ir_dir)
    cfg = source.cfg
    training: dict[str, Any] | None = None
    aux_layers = eagle_aux_layers(spec, cfg.num_layers, attached)
    # The draft reads the target's embedding as the target's first layer does: its rows times
    # the family's scale (Gemma: sqrt(hidden)), here folded into the shared table.
    embedding = scale_embedding(cfg, source.embedding())  # [V, H]
    if spec.train is not None:
        windows = torch.from_numpy(CalibrationSet.load(calibration_dir).tokens)  # [N, T]
        features, final = target_features(source, windows, aux_layers)  # [N, T, 3H], [N, T, H]
        draft, training = train_eagle(
            features,
            final,
            windows,
            source.lm_head(),
            embedding,
            cfg,
            aux_layers,
            spec.train,
            work_dir,
        )
        t = min(_CHECK_TOKENS, windows.shape[1] - 1)
        check_features, check_ids = features[-1, :t], windows[-1, 1 : t + 1]  # held out
        del features, final
    else:
        draft = load_eagle3(
            attached.path, target_embedding=embedding, target_num_layers=cfg.num_layers
        )
        gen = torch.Generator().manual_seed(0)
        check_features = torch.randn(_CHECK_TOKENS, 3 * cfg.hidden_size, generator=gen)
        check_ids = torch.randint(cfg.vocab_size, (_CHECK_TOKENS,), generator=gen)
    draft.eval()
    save_eagle3(
        draft, out / EagleOutput.SPECULATORS, num_speculative_tokens, verifier, cfg.family.hf_class
    )
    export_eagle(draft, out, max_seq_len=max_seq_len, kv_block_size=kv_block_size)
    check = check_eagle(draft, out, check_features, check_ids, kv_block_size)
    record = {
        "origin": "train" if spec.train is not None else "attach",
        **_sizes(draft),
        "aux_layers": list(aux_layers),
        "kv_block_size": kv_block_size,
        "training": training,
        "check": check,
    }
    (out / EagleOutput.RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _sizes(draft: Eagle3Draft) -> dict[str, int]:
    cfg, layer = draft.cfg, draft.cfg.layer
    return {
        "hidden_size": cfg.hidden_size,
        "target_hidden_size": cfg.target_hidden_size,
        "num_heads": layer.num_heads,
        "num_kv_heads": layer.num_kv_heads,
        "head_dim": layer.head_dim,
        "intermediate_size": layer.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
    }
