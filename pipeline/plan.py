"""`ingot plan`: peak memory and time per stage, estimated from config.json and the recipe alone.

Nothing is loaded, hashed or tokenized: the estimates come from the model's shapes, the file
sizes on disk and a few throughput constants, stated here so a reader can judge them. They were
chosen on the project's reference machine (2 CPU cores, fp32 PyTorch) and are deliberately
round; expect the right order of magnitude, not the second.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ingot.calibration.activations import budget_from_env
from ingot.runtime.kv_pool import KVPool, kv_numpy_dtype

from .engines import ENGINE_BUILDERS
from .engines.base import EngineSizing, EngineTarget, engine_name
from .model.architecture import (
    LayerLinear,
    fused_names,
    layer_linear,
    linear_names,
    linear_shape,
    stays_float,
)
from .model.config import ConfigError, ModelConfig
from .model.family import EXPERT
from .model.selection import selected
from .preflight import with_model_defaults
from .quantize.method import LayerCost, LayerWork, Observation, method_of
from .quantize.units import units_of
from .recipe import Quantize, Recipe, RecipeError
from .source import OFFLINE_HINT, hub_cached_snapshot, hub_file, read_config_file, read_config_json

__all__ = [
    "CONSTANTS",
    "Plan",
    "StageEstimate",
    "format_bytes",
    "format_seconds",
    "plan_build",
    "read_hf_config",
]

CONSTANTS = {
    "flops_per_second": 30e9,  # fp32 matmul throughput of torch on the reference machine
    # ... on the calibrated quantizers' and the heads' training's large batched matmuls
    # (1B shape, GPTQ 32 x 512: 1390 s measured, 3656 s at the rate above)
    "batched_flops_per_second": 75e9,
    "cuda_flops_per_second": 20e12,  # what calibration sustains on a datacenter GPU (fp32)
    "rtn_weights_per_second": 170e6,  # RTN rounding (scales, codes) on the reference machine
    "export_weights_per_second": 230e6,  # quantized layer weights packed into the graph's data
    "package_seconds": 0.5,  # manifest, lock, signature, renames
    # copy_file_range of the stage files (page cache, then the disk past the dirty limit):
    # 1B 3.1 GB 1.2 s, 3B 6.2 GB 3.0 s, 8B 15.8 GB 14 s (benchmarks/results/scale.md)
    "package_bytes_per_second": 1.2e9,
    # torch's autograd and optimizer, onnx and onnxruntime imported by the heads stage
    # (demo-medusa: 0.82 GiB measured at a 16 MiB model)
    "training_overhead_bytes": 350 * 2**20,
    "work_chunk_bytes": 32 * 2**20,  # rows the quantizers and the exporter handle at once
    "tokenize_bytes_per_second": 1e6,  # tokenizers, byte-level BPE, one thread
    # Fitted on benchmarks/results/scale.json (1B and 8B shapes, this machine, warm page cache):
    "disk_bytes_per_second": 1.5e9,  # read + hash + write of weights
    "runtime_baseline_bytes": 400 * 2**20,  # python + torch + onnx imported
    "chunk_bytes": 64 * 2**20,  # widest intermediate of a calibration forward chunk (x ~4 live)
    # attention once, the MLP's gate/up twice (observing down, then the outputs), down once
    "forward_passes_per_layer": 1.7,
    # Each engine plug-in's own, for its `estimate` of the engine stage (ORT's: builder.py).
    **{name: value for builder in ENGINE_BUILDERS for name, value in builder.constants.items()},
}


@dataclass(slots=True)
class StageEstimate:
    stage: str
    peak_bytes: int  # host memory (resident set)
    seconds: float
    notes: str = ""
    gpu_bytes: int = 0  # device memory, for a stage that runs on a GPU


@dataclass(slots=True)
class Plan:
    model: dict[str, Any]
    stages: list[StageEstimate] = field(default_factory=list)
    # What the build writes to disk, from the same estimates: stage cache entries (quantized IR,
    # exported graph, engines, interop checkpoints), the artifact, and the hub download of the
    # weights into the Hugging Face cache (0 when the source is local or already cached).
    disk: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> StageEstimate:
        return max(self.stages, key=lambda s: s.peak_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "stages": [asdict(s) for s in self.stages],
            "peak_bytes": self.peak.peak_bytes,
            "peak_stage": self.peak.stage,
            "total_seconds": sum(s.seconds for s in self.stages),
            "disk_bytes": self.disk,
            "constants": CONSTANTS,
        }


@dataclass(frozen=True, slots=True)
class _Shapes:
    """The model's parameters by layer. A mixture of experts' layers differ (a sparse layer
    holds every expert; Qwen3-MoE may keep some layers dense), so what one layer holds is the
    widest layer's (one layer at a time: the most any stage holds), and what a token computes
    with is the active count (of the experts, the top_k it is routed to)."""

    cfg: ModelConfig

    def _layer(self, i: int, active: bool = False) -> int:
        cfg = self.cfg
        sparse = i in cfg.moe_layers
        spec = cfg.family.sparse_layer if sparse else cfg.family.layer  # experts as {e}
        copies = cfg.top_k if active else cfg.num_experts
        params = len(spec.norms) * cfg.hidden_size + len(spec.head_norms) * cfg.head_dim
        for m in spec.linears:
            k, n = linear_shape(cfg, f"layers.{i}.{m.name.replace(EXPERT, '0')}")
            params += n * k * (copies if EXPERT in m.name else 1)
        return params

    @property
    def widest_layer(self) -> int:
        """The index of the layer holding the most parameters."""
        return max(range(self.cfg.num_layers), key=self._layer)

    @property
    def layer_params(self) -> int:
        """The widest layer's parameters: what a stage holds of one layer."""
        return self._layer(self.widest_layer)

    @property
    def active_layer_params(self) -> int:
        """The parameters one token computes with in the widest layer (its forward's flops
        are 2 x this per token)."""
        return self._layer(self.widest_layer, active=True)

    @property
    def layers_params(self) -> int:
        """Every decoder layer's parameters."""
        return sum(self._layer(i) for i in range(self.cfg.num_layers))

    @property
    def embed_params(self) -> int:
        return self.cfg.vocab_size * self.cfg.hidden_size

    @property
    def params(self) -> int:
        head = 0 if self.cfg.tie_word_embeddings else self.embed_params
        return self.layers_params + self.embed_params + head

    @property
    def active_params(self) -> int:
        """The parameters one token computes with (the total for a dense model)."""
        active = sum(self._layer(i, active=True) for i in range(self.cfg.num_layers))
        return self.params - self.layers_params + active

    def linears(self) -> list[tuple[int, int]]:
        """(out, in) of each linear of the widest layer (every expert's)."""
        i = self.widest_layer
        return [linear_shape(self.cfg, f"layers.{i}.{m.name}")[::-1] for m in self.spec(i)]

    def spec(self, i: int) -> tuple[LayerLinear, ...]:
        return self.cfg.layer_spec(i).linears

    def inputs(self, tokens: int) -> tuple[tuple[int, float], ...]:
        """(K, tokens observed) of each quantized group's input in the widest layer: an
        expert's see top_k / experts of the tokens (`LayerWork.inputs`); () for a dense
        model (the methods' default)."""
        cfg = self.cfg
        if not cfg.moe_layers:
            return ()
        i, share = self.widest_layer, cfg.top_k / max(cfg.num_experts, 1)
        inputs = []
        for group in cfg.layer_spec(i).groups:
            linear = layer_linear(f"layers.{i}.{group[0]}", cfg)
            if not stays_float(linear):
                k = linear_shape(cfg, f"layers.{i}.{group[0]}")[0]
                inputs.append((k, tokens * share if ".experts." in group[0] else tokens))
        return tuple(inputs)


def plan_build(
    recipe: Recipe, recipe_path: Path, hf_config: dict[str, Any], source_dir: Path | None
) -> Plan:
    """The estimate for building ``recipe`` (loaded from ``recipe_path``); ``source_dir`` is
    the local checkpoint (None for a hub source not in the local cache: its size is then
    taken from the shapes, and downloading it is part of the disk need)."""
    cfg = ModelConfig.from_hf(hf_config)
    recipe = with_model_defaults(recipe, cfg)  # as the build resolves it (a no-op if it did)
    shapes = _Shapes(cfg)
    weights = _weights_on_disk(shapes, source_dir)
    plan = Plan(_model_summary(shapes, weights, recipe.kv_cache.dtype))
    model = _model_stages(recipe, recipe_path, shapes, recipe.quantize, weights)
    plan.stages += model.stages
    evaluation = _evaluate(shapes, recipe)
    draft = _draft_stages(recipe, recipe_path)
    if draft is not None:  # after the target's engines, as the build runs them
        plan.model["draft"] = draft.summary
        plan.stages += draft.stages
    if evaluation is not None:
        plan.stages.append(evaluation)
    engines = model.engine_bytes + (draft.engine_bytes if draft else 0)
    c = CONSTANTS
    package = c["package_seconds"] + (model.onnx_bytes + engines) / c["package_bytes_per_second"]
    base = CONSTANTS["runtime_baseline_bytes"]
    plan.stages.append(StageEstimate("package", base, package, "copy (digests from the cache)"))
    hub = "hub" in recipe.stage_slice("source")["source"]
    plan.disk = _disk(recipe, shapes, model, weights if hub and source_dir is None else 0)
    if draft is not None:
        for what, size in draft.disk.items():
            plan.disk[what] += size
    return plan


_DISK_RATE = CONSTANTS["disk_bytes_per_second"]


def _weights_on_disk(shapes: _Shapes, source_dir: Path | None) -> int:
    if source_dir is not None:
        return sum(f.stat().st_size for f in source_dir.glob("*.safetensors"))
    return shapes.params * 2  # not downloaded yet: bf16 / fp16 weights assumed


def _model_summary(shapes: _Shapes, weights: int, kv_dtype: str) -> dict[str, Any]:
    cfg = shapes.cfg
    summary = {
        "architecture": cfg.architecture,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "params": shapes.params,
        "weights_bytes_on_disk": weights,
        "kv_cache": {
            "dtype": kv_dtype,
            "bytes_per_token": kv_bytes_per_token(cfg, kv_dtype),
        },
    }
    if cfg.moe_layers:  # a mixture of experts: what a token computes with, and the widest layer
        summary["active_params"] = shapes.active_params
        summary["experts"] = {
            "count": cfg.num_experts,
            "per_token": cfg.top_k,
            "sparse_layers": len(cfg.moe_layers),
            "widest_layer_params": shapes.layer_params,
        }
    return summary


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str) -> int:
    """What one token's K and V take in the runtime's pool, every layer, in ``kv_dtype``."""
    shape = (cfg.num_layers, 1, cfg.num_kv_heads, cfg.head_dim)  # a block of one token
    return KVPool.bytes_per_block(*shape, kv_numpy_dtype(kv_dtype))


@dataclass(slots=True)
class _ModelStages:
    """The estimates of one model's stages (source -> [calibrate] -> quantize -> export ->
    engine per target) and the exported weights' size they imply."""

    stages: list[StageEstimate]
    onnx_bytes: int
    ir_bytes: int
    engine_bytes: int  # every target's engine files


def _model_stages(
    recipe: Recipe,
    recipe_path: Path,
    shapes: _Shapes,
    entries: Sequence[Quantize],
    weights: int,
    prefix: str = "",
) -> _ModelStages:
    """One model's stages; ``prefix`` names the draft's (``draft-quantize``, ...)."""
    base = CONSTANTS["runtime_baseline_bytes"]
    stages = [StageEstimate("source", base, weights / _DISK_RATE, "hash the weight files")]
    calibrated = [e for e in entries if e.calibrated]
    if calibrated and recipe.calibration is not None:
        stages.append(_calibrate(recipe, recipe_path))
        searched = [e for e in entries if method_of(e).searches(e)]
        if searched:
            stages.append(_precision(shapes, recipe, searched))
        stages.append(_quantize_layerwise(shapes, recipe, calibrated))
    else:
        windows = recipe.kv_cache.quantized or (not prefix and recipe.trains_heads())
        if windows and recipe.calibration is not None:
            stages.append(_calibrate(recipe, recipe_path))  # the KV scales' / heads' windows
        stages.append(_quantize_rounded(shapes, entries, weights))
    onnx_bytes = _quantized_bytes(shapes, entries)
    ir_bytes = _quantized_bytes(shapes, entries, code_bits=8)
    stages.append(_export(shapes, ir_bytes, onnx_bytes))
    if recipe.kv_cache.quantized and recipe.calibration is not None:
        _add_kv_scales(stages[-1], shapes, recipe)
    engines = [_engine(shapes, target, onnx_bytes) for target in recipe.targets]
    stages += [stage for stage, _ in engines]
    method = recipe.speculative.method if recipe.speculative is not None else None
    if not prefix and method == "medusa":
        stages.append(_heads(shapes, recipe))
    elif not prefix and method == "eagle":
        stages.append(_eagle(shapes, recipe))
    for estimate in stages:
        estimate.stage = prefix + estimate.stage
    return _ModelStages(stages, onnx_bytes, ir_bytes, sum(size for _, size in engines))


def _heads(shapes: _Shapes, recipe: Recipe) -> StageEstimate:
    """Medusa heads: trained, the target's hidden states over every calibration window
    (held), one forward of the model over them, then per step per head the teacher's and the
    head's lm_head forward and the head's backward (~4 matmuls of batch x hidden x vocab);
    attached, a load and an export."""
    c = CONSTANTS
    h, v = shapes.cfg.hidden_size, shapes.cfg.vocab_size
    spec = recipe.speculative.heads
    train = spec.train
    num_heads = train.num_heads if train is not None else recipe.speculative.num_speculative_tokens
    head_bytes = num_heads * (h * v + h * h) * 4
    if train is None:
        return StageEstimate(
            "heads", int(c["runtime_baseline_bytes"] + 2 * head_bytes), 5.0, "attach"
        )
    cal = recipe.calibration
    tokens = cal.samples * cal.seq_len
    hidden = tokens * h * 4
    rate = c["batched_flops_per_second"]  # 8 windows per layer call, 64 positions per step
    forward = 2 * tokens * shapes.active_params / rate
    per_step = num_heads * train.batch_size * 2 * h * (4 * v + 3 * h * train.num_layers)
    seconds = forward + train.steps * per_step / rate
    # The hidden states three times over (the walk's, the final norm's, the freed temporaries
    # glibc keeps), a layer call's activations and attention over 8 windows, the heads with
    # AdamW's two moments and their gradients, one layer (pydoc-16m, 128 x 512: 1.51 GiB
    # measured; demo-medusa: 0.82 GiB).
    cfg = shapes.cfg
    width = 4 * h + 3 * cfg.intermediate_size
    layer_call = 8 * cal.seq_len * width * 4 + 8 * cfg.num_heads * cal.seq_len**2 * 4 * 2
    peak = c["runtime_baseline_bytes"] + c["training_overhead_bytes"] + 3 * hidden
    peak += layer_call + 4 * head_bytes + shapes.layer_params * 4
    note = f"{train.steps} steps over {cal.samples} x {cal.seq_len} hidden states"
    return StageEstimate("heads", int(peak), seconds, note)


def _eagle(shapes: _Shapes, recipe: Recipe) -> StageEstimate:
    """An EAGLE-3 draft: trained, the target's three aux states and final hidden state over
    every calibration window (held), one forward of the model over them, then per step and
    unrolled drafting step the draft layer and the teacher's and the draft's lm_head over the
    spans;
    attached, a load and an export. Both export and check the graphs (the layer, fc, the
    embedding copied into the draft's graph)."""
    c = CONSTANTS
    cfg = shapes.cfg
    h, v = cfg.hidden_size, cfg.vocab_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = 2 * h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size  # q/k/v read [2H]
    draft_bytes = (layer + 3 * h * h + 2 * h * v) * 4  # layer, fc, lm_head, embedding copy
    train = recipe.speculative.heads.train
    if train is None:
        return StageEstimate(
            "eagle", int(c["runtime_baseline_bytes"] + 3 * draft_bytes), 5.0, "attach"
        )
    cal = recipe.calibration
    tokens = cal.samples * cal.seq_len
    held = tokens * 4 * h * 4  # aux states [3H] + final hidden [H], float32
    rate = c["batched_flops_per_second"]
    forward = 2 * tokens * shapes.active_params / rate
    span_tokens = train.batch_size * train.span
    # Per unrolled step and token: the layer and the two vocab-wide matmuls (the teacher's
    # lm_head, the draft's) forward, 2 FLOPs a weight; backward and the softmaxes fold into the
    # fitted rate (demo-eagle, 400 steps: 130 s measured).
    per_step = train.ttt_steps * span_tokens * 2 * (layer + 2 * h * v)
    seconds = forward + train.steps * per_step / rate
    # The held states twice (the walk's and the final norm's), the draft with AdamW's two
    # moments and gradients, per unrolled step the layer's activations over the spans.
    activations = train.ttt_steps * span_tokens * (6 * h + 2 * cfg.intermediate_size + 2 * v) * 4
    peak = c["runtime_baseline_bytes"] + c["training_overhead_bytes"] + 2 * held
    peak += activations + 4 * draft_bytes + shapes.layer_params * 4
    note = f"{train.steps} steps x {train.ttt_steps} drafts over {cal.samples} x {cal.seq_len}"
    return StageEstimate("eagle", int(peak), seconds, note)


@dataclass(slots=True)
class _DraftStages:
    summary: dict[str, Any]
    stages: list[StageEstimate]
    engine_bytes: int  # what its engines add to the artifact
    disk: dict[str, int]


def _draft_stages(recipe: Recipe, recipe_path: Path) -> _DraftStages | None:
    """The draft model's stages, from its own config.json with the same formulas, or None
    when the recipe builds no draft."""
    spec = recipe.draft()
    if spec is None:
        return None
    source = spec.source.model_dump(mode="json")
    config, local = read_hf_config(source)
    try:
        shapes = _Shapes(ModelConfig.from_hf(config))
    except ConfigError as e:
        raise RecipeError([f"speculative.draft.source: {e}"]) from None
    weights = _weights_on_disk(shapes, local)
    model = _model_stages(
        recipe, recipe_path, shapes, recipe.draft_quantize(), weights, prefix="draft-"
    )
    engines = model.engine_bytes
    download = weights if "hub" in source and local is None else 0
    disk = {
        "stage_cache": model.ir_bytes + model.onnx_bytes + engines,
        "artifact": engines,  # its engines only: no portable graph of the draft
        "hub_download": download,
    }
    summary = _model_summary(shapes, weights, recipe.kv_cache.dtype)
    return _DraftStages(summary, model.stages, engines, disk)


def _disk(recipe: Recipe, shapes: _Shapes, model: _ModelStages, download: int) -> dict[str, int]:
    """Bytes written: the stage cache's new entries, the artifact, the hub download. The IR
    holds one byte per code (int8 / uint8, whatever the bits); the graph and each interop
    checkpoint hold about the exported weights, each engine what its plug-in estimates. The
    artifact ships the graph where the recipe asks for it, or where no engine writes a file
    (engines built at load from the graph read it: engines/base.py `ships_portable`)."""
    ir = _quantized_bytes(shapes, recipe.quantize, code_bits=8)
    onnx_bytes, engines = model.onnx_bytes, model.engine_bytes
    interop = len(recipe.stage_slice("interop")["interop"]) * onnx_bytes
    portable = onnx_bytes if recipe.artifact.portable or engines == 0 else 0
    return {
        "stage_cache": ir + onnx_bytes + engines + interop,
        "artifact": portable + engines + interop,
        "hub_download": download,
    }


def _quantized_bytes(
    shapes: _Shapes, entries: Sequence[Quantize], code_bits: int | None = None
) -> int:
    """Size of the exported weights: quantized layers at their bits (or ``code_bits`` per
    code), the rest fp32."""
    if not entries:
        return shapes.params * 4
    bits = code_bits or min(e.bits for e in entries)
    layers = shapes.layers_params
    return int(layers * bits / 8 * 1.1) + (shapes.params - layers) * 4


def _largest_part(shapes: _Shapes) -> int:
    """Bytes of the largest piece a streaming stage holds at once: one float32 decoder layer
    with its int8 codes, or the float32 embedding (or an untied lm_head) while it is read."""
    return max(shapes.layer_params * 5, shapes.embed_params * 4)


def _quantize_rounded(shapes: _Shapes, entries: Sequence[Quantize], weights: int) -> StageEstimate:
    # Rounding without data (RTN, FP8), one layer at a time (quantize/driver.py): read, round,
    # write; then the IR is assembled tensor by tensor. Reads the weights once, writes the IR
    # twice (layers, then assembled).
    c = CONSTANTS
    ir = _quantized_bytes(shapes, entries, code_bits=8)
    peak = c["runtime_baseline_bytes"] + _largest_part(shapes) + 3 * c["work_chunk_bytes"]
    rounding = shapes.layers_params / c["rtn_weights_per_second"]
    seconds = (weights + 3 * ir) / c["disk_bytes_per_second"] + (rounding if entries else 0)
    note = "layer by layer: one float layer + codes, or the embedding" if entries else "copy"
    return StageEstimate("quantize", int(peak), seconds, note)


def _export(shapes: _Shapes, ir_bytes: int, onnx_bytes: int) -> StageEstimate:
    # The graph is built layer by layer from the IR on disk, each layer's initializers written
    # to the external data as it goes (export/decoder.py): one layer's tensors at a time.
    c = CONSTANTS
    peak = c["runtime_baseline_bytes"] + _largest_part(shapes) + 2 * c["work_chunk_bytes"]
    layers = shapes.layers_params
    seconds = ir_bytes / c["disk_bytes_per_second"] + layers / c["export_weights_per_second"]
    return StageEstimate("export", int(peak), seconds, "layer by layer from the IR")


def _add_kv_scales(export: StageEstimate, shapes: _Shapes, recipe: Recipe) -> None:
    """An int8 / fp8 KV cache's scales are measured in the export stage before the graph is
    built (quantize/kv_scales.py): one forward pass per layer over the calibration windows
    plus the K/V projections, on activations of two stores that spill past the budget."""
    c, cal = shapes.cfg, recipe.calibration
    tokens = cal.samples * cal.seq_len
    acts = tokens * c.hidden_size * 4  # one store, fp32
    budget = budget_from_env()
    held = 2 * CONSTANTS["chunk_bytes"] if acts > budget // 3 else 2 * acts
    attention = 4 * cal.samples * cal.seq_len**2 * c.num_heads * c.head_dim
    forward = 2 * shapes.active_layer_params * tokens + attention
    export.seconds += c.num_layers * forward / CONSTANTS["flops_per_second"]
    layer = shapes.layer_params * 4 * 2  # the layer and its dequantized linears
    peak = CONSTANTS["runtime_baseline_bytes"] + held + max(layer, shapes.embed_params * 4)
    export.peak_bytes = max(export.peak_bytes, int(peak))
    export.notes += f"; first {recipe.kv_cache.dtype} KV scales on {tokens} calibration tokens"


def _engine(shapes: _Shapes, target: EngineTarget, onnx_bytes: int) -> tuple[StageEstimate, int]:
    """The target's engine stage, as its engine plug-in estimates it, and its files' size."""
    tied = shapes.embed_params * 4 if shapes.cfg.tie_word_embeddings else 0
    sizing = EngineSizing(onnx_bytes, tied, CONSTANTS["runtime_baseline_bytes"])
    estimate = ENGINE_BUILDERS.get(target.engine).estimate(target, sizing)
    stage = StageEstimate(
        f"engine:{engine_name(target)}", estimate.peak_bytes, estimate.seconds, estimate.notes
    )
    return stage, estimate.disk_bytes


def _calibrate(recipe: Recipe, recipe_path: Path) -> StageEstimate:
    cal = recipe.calibration
    path = Path(os.path.expanduser(cal.dataset))
    if not path.is_absolute():
        path = recipe_path.absolute().parent / path
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    size = sum(p.stat().st_size for p in files if p.exists())
    note = f"{cal.samples} x {cal.seq_len} tokens"
    note += f" from {size / 2**20:.1f} MiB of data" if size else " (hub dataset: size unknown)"
    seconds = size / CONSTANTS["tokenize_bytes_per_second"]
    return StageEstimate("calibrate", CONSTANTS["runtime_baseline_bytes"] + 6 * size, seconds, note)


def _quantize_layerwise(
    shapes: _Shapes, recipe: Recipe, entries: Sequence[Quantize]
) -> StageEstimate:
    c, cal = shapes.cfg, recipe.calibration
    tokens = cal.samples * cal.seq_len
    acts = tokens * max(c.hidden_size, c.num_heads * c.head_dim) * 4  # one store, fp32
    budget = budget_from_env()
    spilled = acts > budget // 3  # three stores alive at most, a third of the budget each
    act_bytes = 3 * CONSTANTS["chunk_bytes"] if spilled else 3 * acts
    attention = 4 * cal.samples * cal.seq_len**2 * c.num_heads * c.head_dim
    forward = 2 * shapes.active_layer_params * tokens + attention
    work = LayerWork(tuple(shapes.linears()), tokens, forward, shapes.inputs(tokens))
    costs = _method_costs(entries, work)
    widest_in = max(k for _, k in shapes.linears())
    hessians = any(Observation.HESSIAN in method_of(e).observes(e) for e in entries)
    hessian = widest_in**2 * 4 * 2 if hessians else 0
    layer = shapes.layer_params * 4 * 3  # float layer, its quantized form, a dequantized view
    held = sum(cost.held_bytes for cost in costs.values())
    work = layer + hessian + held + 4 * CONSTANTS["chunk_bytes"]
    device = str(getattr(cal, "device", "cpu"))
    on_gpu = device.startswith("cuda")
    # The embedding is read before layer 0 (to embed the calibration tokens) and again when the
    # IR is assembled, never beside a layer's work.
    host = act_bytes + max(shapes.embed_params * 4, shapes.layer_params * 5 if on_gpu else work)
    peak = CONSTANTS["runtime_baseline_bytes"] + host
    flops = CONSTANTS["cuda_flops_per_second" if on_gpu else "batched_flops_per_second"]
    per_layer = CONSTANTS["forward_passes_per_layer"] * forward
    per_layer += sum(cost.flops for cost in costs.values())
    seconds = c.num_layers * per_layer / flops
    where = f"spilled to disk past the {budget / 2**30:.1f} GiB budget" if spilled else "in memory"
    note = (
        f"{'/'.join(sorted(costs))} layer by layer: one layer {layer / 2**20:.0f} MiB, "
        f"activations 3 x {acts / 2**20:.0f} MiB ({where}), Hessians {hessian / 2**20:.0f} MiB"
    )
    return StageEstimate("quantize", int(peak), seconds, note, gpu_bytes=work if on_gpu else 0)


def _precision(shapes: _Shapes, recipe: Recipe, entries: Sequence[Quantize]) -> StageEstimate:
    """The precision search's measurement (quantize/sensitivity.py): one float forward of the
    model over the calibration windows, then per (unit, candidate) trial its layer quantized by
    the candidate's method, the layers after it and the final norm + lm_head twice (the trial's
    and the float logits, scored by KL). Holds the float layers and the inputs of every layer
    (spilled past the activation budget)."""
    c, cal = shapes.cfg, recipe.calibration
    tokens = cal.samples * cal.seq_len
    attention = 4 * cal.samples * cal.seq_len**2 * c.num_heads * c.head_dim
    forward = 2 * shapes.active_layer_params * tokens + attention
    head = 2 * tokens * c.hidden_size * c.vocab_size
    work = LayerWork(tuple(shapes.linears()), tokens, forward, shapes.inputs(tokens))
    trials, passes, flops = 0, 0.0, 0.0
    for entry in entries:
        for unit in units_of(selected(entry, linear_names(c), fused_names(c)), c):
            for candidate in method_of(entry).nested(entry).values():
                after = c.num_layers - unit.layer - 1
                costs = method_of(candidate).layer_costs(candidate, work)
                trials += 1
                passes += CONSTANTS["forward_passes_per_layer"] + after
                flops += sum(cost.flops for cost in costs.values()) + 2 * head
    flops += passes * forward + c.num_layers * forward
    acts = tokens * c.hidden_size * 4
    held = min((c.num_layers + 1) * acts, budget_from_env()) + 4 * CONSTANTS["chunk_bytes"]
    peak = CONSTANTS["runtime_baseline_bytes"] + shapes.params * 4 + held
    seconds = flops / CONSTANTS["batched_flops_per_second"]
    note = (
        f"{trials} trials (unit x candidate): {passes + c.num_layers:.0f} layer forwards and "
        f"{2 * trials} lm_head passes over {tokens} calibration tokens"
    )
    return StageEstimate("precision", int(peak), seconds, note)


def _method_costs(entries: Sequence[Quantize], work: LayerWork) -> dict[str, LayerCost]:
    """{method: its share of one layer's pass}, each method once (`QuantMethod.layer_costs`:
    GPTQ's solve, AWQ's searches, and what a method runs on another's behalf)."""
    costs: dict[str, LayerCost] = {}
    for entry in entries:
        costs.update(method_of(entry).layer_costs(entry, work))
    return costs


def _evaluate(shapes: _Shapes, recipe: Recipe) -> StageEstimate | None:
    section = getattr(recipe, "evaluate", None)
    ppl = getattr(section, "perplexity", None) if section is not None else None
    if ppl is None:
        return None
    windows = ppl.max_windows or 64  # unknown until the text is tokenized: assume 64
    tokens = windows * ppl.seq_len
    # Three forward passes over the windows: the float model, the quantized IR, the engine.
    seconds = 3 * 2 * shapes.active_params * tokens / CONSTANTS["flops_per_second"]
    peak = CONSTANTS["runtime_baseline_bytes"] + 2 * shapes.params * 4
    vocab_logits = 16 * ppl.seq_len * shapes.cfg.vocab_size * 4
    approx = "~" if not ppl.max_windows else ""
    note = f"original, quantized IR and engine over {approx}{windows} windows"
    return StageEstimate("evaluate", peak + vocab_logits, seconds, note)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


PLAN_OFFLINE_HINT = f"{OFFLINE_HINT}; or give `ingot plan --config FILE` a copy of its config.json"


def read_hf_config(
    source: dict[str, Any], config: Path | None = None
) -> tuple[dict[str, Any], Path | None]:
    """config.json of the recipe's source without fetching weights: (config, local checkpoint
    directory, or None for a hub source whose weights are not in the local HF cache).

    ``config`` (``ingot plan --config``) is read instead of the source's config.json, and the
    hub is not contacted: a plan of a hub recipe runs offline on a vendored copy. Without it, a
    hub source's config.json comes from the hub, or from the HF cache when the hub cannot be
    reached; neither is a one-line SourceError naming the id and the revision.
    """
    if "path" in source:
        path = Path(source["path"])
        if config is not None:
            return read_config_file(config), (path if path.is_dir() else None)
        return read_config_json(path), path
    cached = hub_cached_snapshot(source["hub"], source["revision"])
    if config is not None:
        return read_config_file(config), cached
    if cached is not None and re.fullmatch(r"[0-9a-f]{40}", source["revision"]):
        return read_config_json(cached), cached  # a commit's files never change
    file = hub_file(source["hub"], source["revision"], "config.json", hint=PLAN_OFFLINE_HINT)
    return read_config_file(file), cached
