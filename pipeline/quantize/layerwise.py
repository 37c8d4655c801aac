"""Calibrated quantization (GPTQ, AWQ) of a Llama-family model, one decoder layer at a time.

Inside a layer the linears are quantized true-sequentially, in the order their inputs are
computed: q,k,v -> o -> gate,up -> down. Before each group the layer runs on the calibration
activations (up to that group's input only) with the groups before it already quantized, so
every group is fitted to the inputs it will really see. RTN entries of the same recipe are
applied when the layer is loaded. Across layers `ingot.calibration.runner` feeds each layer the
quantized outputs of the one before.

Two drivers share this: `quantize_model_calibrated` (a model already in memory; for tests and
benchmarks) and `quantize_checkpoint` (the quantize stage: streams layers from the safetensors,
checkpoints each finished layer in a work directory, resumes, writes the IR tensor by tensor).
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ingot.calibration.activations import ActivationStore, budget_from_env
from ingot.calibration.capture import ChannelObserver, HessianObserver, StopForward, observe_input
from ingot.calibration.dataset import CalibrationSet
from ingot.calibration.runner import LayerCheckpoints, run_layers

from ..model.config import ModelConfig
from ..model.layers import DecoderLayer
from ..model.llama import LlamaModel, causal_mask
from ..model.load import CheckpointReader
from ..model.qlinear import QuantizedLinear
from ..model.rope import cos_sin
from ..recipe_checks import module_selected
from .awq import apply_scales, quantize_linear_awq, scaling_groups, search_scales
from .checkpoint import (
    layer_tensor_sources,
    load_layer,
    save_layer,
    write_ir_config,
    write_safetensors,
)
from .gptq import quantize_linear_gptq
from .rtn import quantize_linear_rtn, quantize_weight
from .threads import solver_threads

__all__ = [
    "CALIBRATED_METHODS",
    "LAYER_GROUPS",
    "LayerForward",
    "needs_calibration",
    "quantize_checkpoint",
    "quantize_layer",
    "quantize_model_calibrated",
]

CALIBRATED_METHODS = ("gptq", "awq")
# True-sequential order: each group's input depends only on the groups before it.
LAYER_GROUPS = (
    ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    ("attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)
AWQ_SAMPLE_TOKENS = 4096  # token rows AWQ's scale and clip searches measure their error on
_CHUNK_BYTES = 64 * 2**20  # widest intermediate of one forward chunk


def needs_calibration(specs: list[dict[str, Any]]) -> bool:
    return any(spec["method"] in CALIBRATED_METHODS for spec in specs)


def _layer_plan(i: int, specs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{linear name inside layer i: the spec selecting it} (the recipe checks allow one)."""
    plan = {}
    for group in LAYER_GROUPS:
        for name in group:
            for spec in specs:
                if module_selected(f"layers.{i}.{name}", spec["targets"], spec["ignore"]):
                    plan[name] = spec
                    break
    return plan


@dataclass(slots=True)
class LayerForward:
    """Runs a decoder layer on [B, T, hidden] calibration activations (positions 0..T-1)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    batch: int  # samples per forward chunk

    @classmethod
    def for_config(cls, cfg: ModelConfig, samples: int, seq_len: int) -> LayerForward:
        positions = torch.arange(seq_len)[None]  # [1, T]
        cos, sin = cos_sin(cfg, positions, seq_len=seq_len)  # [1, T, D/2]
        mask = causal_mask(positions, positions, cfg.sliding_window)  # [1, 1, T, T]
        widest = max(cfg.hidden_size * 4, cfg.intermediate_size * 3, cfg.num_heads * seq_len)
        batch = max(1, min(samples, _CHUNK_BYTES // (seq_len * widest * 4)))
        return cls(cos, sin, mask, batch)

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer(x, self.cos, self.sin, self.mask)[0]


def _dequantize_in_place(layer: nn.Module) -> list[tuple[str, QuantizedLinear]]:
    """Swap each QuantizedLinear for a float Linear holding its dequantized weight; returns
    what was swapped. Outputs are bit-identical (QuantizedLinear.forward is exactly
    ``linear(x, dequantize(), bias)``) but the dequantize runs once, not once per chunk."""
    swapped = []
    for name, m in list(layer.named_modules()):
        if isinstance(m, QuantizedLinear):
            with torch.device("meta"):
                linear = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            linear.weight = nn.Parameter(m.dequantize(), requires_grad=False)
            linear.bias = m.bias
            _replace(layer, name, linear)
            swapped.append((name, m))
    return swapped


def _observe(layer, module, observers, inputs: ActivationStore, forward: LayerForward) -> None:
    swapped = _dequantize_in_place(layer)
    try:
        with observe_input(module, observers), torch.no_grad():
            for start in range(0, len(inputs), forward.batch):
                with contextlib.suppress(StopForward):
                    forward(layer, inputs.read(start, min(start + forward.batch, len(inputs))))
    finally:
        for name, quantized in swapped:
            _replace(layer, name, quantized)


def _for_propagation(layer: nn.Module) -> nn.Module:
    _dequantize_in_place(layer)
    return layer


def _replace(layer: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(layer.get_submodule(parent), child, new)


def quantize_layer(
    layer: DecoderLayer,
    inputs: ActivationStore,
    plan: dict[str, dict[str, Any]],
    forward: LayerForward,
    cfg: ModelConfig,
) -> None:
    """Quantize the linears of ``plan`` in place, true-sequentially, on the layer's inputs."""
    with torch.no_grad():
        for name, spec in plan.items():
            if spec["method"] == "rtn":
                linear = layer.get_submodule(name)
                q = quantize_linear_rtn(linear, spec["bits"], spec["group_size"], spec["symmetric"])
                _replace(layer, name, q)
    scaled_by = {linears: prev for prev, linears in scaling_groups(cfg.num_heads, cfg.num_kv_heads)}
    samples, seq_len = inputs.shape[0], inputs.shape[1]
    for group in LAYER_GROUPS:
        chosen = [n for n in group if n in plan and plan[n]["method"] in CALIBRATED_METHODS]
        if not chosen:
            continue
        methods = {plan[n]["method"] for n in chosen}
        first = layer.get_submodule(group[0])  # the group's linears share one input
        hessian = HessianObserver(first.in_features) if "gptq" in methods else None
        channels = None
        if "awq" in methods:
            channels = ChannelObserver(first.in_features, samples, seq_len, AWQ_SAMPLE_TOKENS)
        _observe(layer, first, [o for o in (hessian, channels) if o], inputs, forward)

        x = None
        with torch.no_grad(), solver_threads(first.in_features):
            if channels is not None:
                x = channels.sample()  # [S * T, K]
                all_awq = all(plan.get(n, {}).get("method") == "awq" for n in group)
                if all_awq and group in scaled_by:
                    linears = [layer.get_submodule(n) for n in group]
                    s = search_scales(
                        channels.mean_abs(),
                        [m.weight.data for m in linears],
                        [_quantizer(plan[n]) for n in group],
                        _inspected_output(layer, group, x.view(-1, seq_len, x.shape[-1]), forward),
                    )
                    apply_scales(layer.get_submodule(scaled_by[group]), linears, s)
                    x = x / s  # what the scaled linears now receive
            h = None if hessian is None else hessian.hessian()
            for name in chosen:
                quantized = _quantize_one(layer.get_submodule(name), name, plan[name], h, x)
                _replace(layer, name, quantized)


def _inspected_output(layer: DecoderLayer, group: tuple[str, ...], x: torch.Tensor, forward):
    """output(ws): what AWQ's scale search compares, with the group's linears holding ``ws``:
    the attention block's output for q,k,v, the MLP's for gate,up, else the linear's own.
    x: [S, T, K] the group's input on the sample sequences."""
    linears = [layer.get_submodule(n) for n in group]

    def module() -> torch.Tensor:
        if group == LAYER_GROUPS[0]:
            return layer.attn(x, forward.cos, forward.sin, forward.mask)[0]
        if group == LAYER_GROUPS[2]:
            return layer.mlp(x)
        return linears[0](x)

    def output(weights: list[torch.Tensor]) -> torch.Tensor:
        saved = [m.weight for m in linears]
        try:
            for m, w in zip(linears, weights, strict=True):
                m.weight = nn.Parameter(w, requires_grad=False)
            return module()
        finally:
            for m, w in zip(linears, saved, strict=True):
                m.weight = w

    return output


def _quantizer(spec: dict[str, Any]) -> tuple[int, int, bool]:
    return spec["bits"], spec["group_size"], spec["symmetric"]


def _quantize_one(linear: nn.Linear, name: str, spec: dict, hessian, x) -> QuantizedLinear:
    bits, group_size, symmetric = _quantizer(spec)
    common = {"bits": bits, "group_size": group_size, "symmetric": symmetric}
    if spec["method"] == "gptq":
        return quantize_linear_gptq(
            linear,
            hessian,
            **common,
            actorder=spec["actorder"],
            static_groups=spec["static_groups"],
            dampening_frac=spec["dampening_frac"],
            block_size=spec["block_size"],
        )
    return quantize_linear_awq(linear, x, name=name, **common)


def _embed(table: torch.Tensor, tokens: torch.Tensor, store: ActivationStore, batch: int) -> None:
    for start in range(0, len(tokens), batch):
        store.write(start, nn.functional.embedding(tokens[start : start + batch], table))


def _summaries(specs: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    return [
        {**spec, "modules": sum(module_selected(n, spec["targets"], spec["ignore"]) for n in names)}
        for spec in specs
    ]


def _rtn_spec(name: str, specs: list[dict[str, Any]]) -> dict[str, Any] | None:
    # Outside the decoder layers (lm_head) only RTN applies: the recipe checks refuse the rest.
    for spec in specs:
        if module_selected(name, spec["targets"], spec["ignore"]):
            return spec if spec["method"] == "rtn" else None
    return None


def quantize_model_calibrated(
    model: LlamaModel,
    specs: list[dict[str, Any]],
    calibration: CalibrationSet,
    *,
    budget_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Quantize a model in memory (every spec, RTN ones included); returns the summaries."""
    cfg = model.cfg
    tokens = torch.as_tensor(calibration.tokens)
    n, t = tokens.shape
    forward = LayerForward.for_config(cfg, n, t)
    budget = budget_from_env() if budget_bytes is None else budget_bytes
    with tempfile.TemporaryDirectory(prefix="ingot-acts-") as tmp:
        work = Path(tmp)

        def first_inputs() -> ActivationStore:
            store = ActivationStore((n, t, cfg.hidden_size), budget // 2, work / "acts-embed.bin")
            _embed(model.embed_tokens.weight.data, tokens, store, forward.batch)
            return store

        def quantize(i: int, x: ActivationStore) -> None:
            quantize_layer(model.layers[i], x, _layer_plan(i, specs), forward, cfg)

        run_layers(
            cfg.num_layers,
            first_inputs,
            quantize_layer=quantize,
            load_layer=lambda i: _for_propagation(copy.deepcopy(model.layers[i])),
            new_store=lambda i: ActivationStore(
                (n, t, cfg.hidden_size), budget // 2, work / f"acts-{i % 2}.bin"
            ),
            forward=forward,
            batch=forward.batch,
        )
    spec = _rtn_spec("lm_head", specs)
    if spec is not None:
        model.lm_head = quantize_linear_rtn(
            model.lm_head, spec["bits"], spec["group_size"], spec["symmetric"]
        )
    linears = (nn.Linear, QuantizedLinear)
    names = [name for name, m in model.named_modules() if isinstance(m, linears)]
    return _summaries(specs, names)


def quantize_checkpoint(
    source: Path,
    specs: list[dict[str, Any]],
    calibration: CalibrationSet,
    out: Path,
    work_dir: Path,
    *,
    budget_bytes: int | None = None,
    on_layer=None,
) -> list[dict[str, Any]]:
    """The quantize stage for calibrated recipes: ``out`` gets ir_config.json + ir.safetensors.

    ``work_dir`` holds the finished layers (``layer_{i}.*``) and spilled activations; it must
    survive a crash for a rerun to resume. ``on_layer(i, event)`` reports progress.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    reader = CheckpointReader(source)
    cfg = reader.cfg
    tokens = torch.as_tensor(calibration.tokens)
    n, t = tokens.shape
    forward = LayerForward.for_config(cfg, n, t)
    budget = budget_from_env() if budget_bytes is None else budget_bytes
    checkpoints = LayerCheckpoints(work_dir)
    shape = (n, t, cfg.hidden_size)

    def first_inputs() -> ActivationStore:
        store = ActivationStore(shape, budget // 2, work_dir / "acts-embed.bin")
        _embed(reader.tensor("embed_tokens.weight"), tokens, store, forward.batch)
        return store

    def quantize(i: int, x: ActivationStore) -> None:
        layer = reader.layer(i)
        quantize_layer(layer, x, _layer_plan(i, specs), forward, cfg)
        save_layer(layer, checkpoints.stem(i))

    run_layers(
        cfg.num_layers,
        first_inputs,
        quantize_layer=quantize,
        load_layer=lambda i: _for_propagation(load_layer(cfg, checkpoints.stem(i))),
        new_store=lambda i: ActivationStore(shape, budget // 2, work_dir / f"acts-{i % 2}.bin"),
        forward=forward,
        batch=forward.batch,
        checkpoints=checkpoints,
        on_layer=on_layer,
    )
    return _assemble(reader, specs, checkpoints, out)


def _assemble(reader: CheckpointReader, specs, checkpoints: LayerCheckpoints, out: Path):
    """ir_config.json + ir.safetensors from the layer checkpoints and the source's other
    tensors, one tensor in memory at a time."""
    cfg = reader.cfg
    h, v = cfg.hidden_size, cfg.vocab_size
    embed, norm = "embed_tokens.weight", "norm.weight"
    sources = [
        (embed, (v, h), torch.float32, lambda: reader.tensor(embed)),
        (norm, (h,), torch.float32, lambda: reader.tensor(norm)),
    ]
    quantized = {}
    for i in range(cfg.num_layers):
        stem = checkpoints.stem(i)
        sources += layer_tensor_sources(stem, f"layers.{i}.")
        layer_meta = json.loads(stem.with_suffix(".json").read_text())["quantized"]
        quantized.update({f"layers.{i}.{k}": q for k, q in layer_meta.items()})
    head_name = "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    spec = _rtn_spec("lm_head", specs)
    if spec is not None:
        codes, scales, zeros = quantize_weight(
            reader.tensor(head_name), spec["bits"], spec["group_size"], spec["symmetric"]
        )
        g = h if spec["group_size"] == -1 else spec["group_size"]
        quantized["lm_head"] = {"bits": spec["bits"], "group_size": g}
        parts = {"codes": codes, "scales": scales, "zero_points": zeros}
        for key, t in parts.items():
            if t is not None:
                sources.append((f"lm_head.{key}", tuple(t.shape), t.dtype, lambda t=t: t))
    elif not cfg.tie_word_embeddings:
        sources.append(("lm_head.weight", (v, h), torch.float32, lambda: reader.tensor(head_name)))
    write_ir_config(cfg, dict(sorted(quantized.items())), out)
    write_safetensors(out / "ir.safetensors", sources)
    names = [*(f"layers.{i}.{n}" for i in range(cfg.num_layers) for g_ in LAYER_GROUPS for n in g_)]
    return _summaries(specs, [*names, "lm_head"])
