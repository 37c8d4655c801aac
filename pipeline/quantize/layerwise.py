"""Calibrated quantization of one Llama-family decoder layer, by the methods of its entries
(`method.QuantMethod`: GPTQ, AWQ, SmoothQuant W8A8, static FP8 inputs, ...), none named here.

The linears are quantized group by group in the order their inputs are computed:
q,k,v -> o -> gate,up -> down. When an entry asks for it (`QuantMethod.sequential`: GPTQ's
``true_sequential``, its default) each group is fitted to the inputs the already quantized
groups before it produce; the layer is then computed in steps along that order, keeping what
later steps reuse (the attention output before o_proj, the residual stream after attention),
so the attention runs once. Otherwise (AWQ, or GPTQ with ``true_sequential: false``) every
group's input is observed in one pass over the layer as loaded, as llm-compressor and AutoAWQ
do. Either way the layer's outputs are bit-identical to a plain forward of the finished layer
(the same operations on the same chunks), which is what a resumed run replays.

Per group, the walk measures what its entries observe (`Observation`), lets the one method
that selects every linear of the group fold a scale into the module before it
(`QuantMethod.scale_group`: AWQ, SmoothQuant), then has each linear's method finish it from
those observations (`QuantMethod.finish`). Entries of different methods may share a group:
each finishes its own linears from the same observations. The driver (`driver.py`) rounds
the linears whose methods need no data beforehand (`round_linears`: RTN, FP8) and runs this
layer by layer.

Everything here runs on the layer's device (`LayerForward.device`; the driver moves the layer
there): the chunks arrive there from the activation stores, the observers accumulate there and
GPTQ / AWQ solve there, so the quantized linears are made on that device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ingot.calibration.activations import ActivationStore
from ingot.calibration.capture import AbsMaxObserver, ChannelObserver, HessianObserver, input_of

from ..model.architecture import GATE_UP, LAYER_GROUPS, QKV, scaling_groups, stays_float
from ..model.config import ModelConfig
from ..model.families.llama import LAYER
from ..model.family import LayerSpec
from ..model.layers import DecoderLayer
from ..model.llama import window_masks
from ..model.qlinear import dequantize_in_place, dequantized, replace_module
from ..model.rope import cos_sin
from ..model.selection import Holder, entry_for
from .method import CHANNEL_SAMPLE_TOKENS, Group, GroupInputs, Observation, QuantEntry, method_of
from .threads import solver_threads

__all__ = [
    "LayerSteps",
    "Observed",
    "attention_in_sequence",
    "mlp_outputs",
    "LayerForward",
    "LayerPlan",
    "dequantized_for_propagation",
    "layer_plan",
    "needs_calibration",
    "quantize_layer",
    "round_linears",
]

_CHUNK_BYTES = 64 * 2**20  # widest intermediate of one forward chunk


# {linear name inside a layer: the quantize entry selecting it}, in compute order.
LayerPlan = dict[str, QuantEntry]


def needs_calibration(entries: Sequence[QuantEntry]) -> bool:
    return any(entry.calibrated for entry in entries)


def round_linears(module: nn.Module, plan: Mapping[str, QuantEntry]) -> None:
    """Replace, in place, each linear of ``module`` that ``plan`` ({name inside module: the
    entry selecting it}) gives an entry whose method rounds without data (`QuantMethod.round`:
    RTN, FP8) by the rounded linear; the others are left to the walk. The one place such
    rounding is applied: to a decoder layer's linears and to lm_head alike. (An FP8 entry with
    static activations gets its input scale later, in the walk.)"""
    with torch.no_grad():
        for name, entry in plan.items():
            linear = module.get_submodule(name)
            if not isinstance(linear, nn.Linear):
                raise ValueError(
                    f"{name}: {entry.method} rounds a float linear, found {type(linear).__name__}"
                )
            rounded = method_of(entry).round(linear, entry)
            if rounded is not None:
                replace_module(module, name, rounded)


def layer_plan(
    i: int,
    entries: Sequence[QuantEntry],
    fused: Mapping[str, Holder] | None = None,
    cfg: ModelConfig | None = None,
) -> LayerPlan:
    """Which entry quantizes each linear of layer i (the recipe checks allow one), of what
    `cfg`'s layer i holds (None: the Llama layer); `fused`: the fused tensors holding linears,
    which patterns may name (`architecture.fused_names`)."""
    plan = {}
    spec = LAYER if cfg is None else cfg.layer_spec(i)
    for group in spec.groups:
        for name in group:
            if stays_float(spec.linear(name)):
                continue
            entry = entry_for(f"layers.{i}.{name}", entries, fused)
            if entry is not None:
                plan[name] = entry
    return plan


@dataclass(slots=True)
class LayerForward:
    """Runs a decoder layer on [B, T, hidden] calibration activations (positions 0..T-1), on
    ``device`` (where the layer and the activations it is given are)."""

    cos: torch.Tensor
    sin: torch.Tensor
    masks: dict[int | None, torch.Tensor]  # [1, 1, T, T] per layer window
    batch: int  # samples per forward chunk
    device: torch.device

    @classmethod
    def for_config(
        cls, cfg: ModelConfig, samples: int, seq_len: int, device: torch.device | str = "cpu"
    ) -> LayerForward:
        device = torch.device(device)
        positions = torch.arange(seq_len)[None]  # [1, T]
        # Computed on the CPU on every device: the device then runs with the same tables.
        cos, sin = cos_sin(cfg, positions, seq_len=seq_len)  # [1, T, D/2]
        masks = window_masks(positions, positions, cfg)  # [1, 1, T, T] each
        widest = max(cfg.hidden_size * 4, cfg.intermediate_size * 3, cfg.num_heads * seq_len)
        batch = max(1, min(samples, _CHUNK_BYTES // (seq_len * widest * 4)))
        masks = {w: m.to(device) for w, m in masks.items()}
        return cls(cos.to(device), sin.to(device), masks, batch, device)

    def rope_and_mask(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and the mask of `layer`'s window: what its attention takes after x."""
        return self.cos, self.sin, self.masks[layer.window]

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer(x, *self.rope_and_mask(layer))[0]


def dequantized_for_propagation(layer: nn.Module) -> nn.Module:
    """The finished layer, ready to run many chunks (the driver's replay of resumed layers)."""
    dequantize_in_place(layer)
    return layer


# A slice of samples [start, stop) -> the activations of those samples at some point.
Chunks = Callable[[int, int], torch.Tensor]


def quantize_layer(
    layer: DecoderLayer,
    x: ActivationStore,
    plan: LayerPlan,
    forward: LayerForward,
    cfg: ModelConfig,
    new_store: Callable[[str, tuple[int, ...]], ActivationStore],
    *,
    outputs: bool = True,
) -> ActivationStore | None:
    """Quantize the calibrated linears of ``plan`` in place on the layer's inputs ``x``
    [N, T, hidden] (its RTN linears, already quantized, are left as they are);
    returns the quantized layer's outputs (a store from ``new_store(name, shape)``), or None
    without ``outputs`` (the last layer: its outputs feed nothing).

    True-sequentially when an entry of the plan asks for it (GPTQ's default); otherwise
    every group is observed on the layer as loaded, in one pass. (A sparse layer:
    `moe_calibration.quantize_sparse_layer`.)"""
    step = LayerSteps(layer, plan, forward, cfg, x.shape[0], x.shape[1])
    if step.sequential:
        return _true_sequential(step, x, new_store, outputs)
    return _observe_once(step, x, new_store, outputs)


def _observe_once(step: LayerSteps, x: ActivationStore, new_store, outputs: bool):
    layer, forward = step.layer, step.forward
    observed = {group: step.observers(group) for group in LAYER_GROUPS}
    qkv, o, gate_up, down = (observed[g] for g in LAYER_GROUPS)

    def observe(a: int, b: int) -> None:
        xs = x.read(a, b)
        normed = layer.attn_norm(xs)
        step.feed(qkv, normed)
        attn = input_of(
            layer.attn.o_proj, lambda: layer.attn(normed, *forward.rope_and_mask(layer))
        )
        step.feed(o, attn)
        h = layer.mlp_norm(xs + layer.attn.o_proj(attn))
        step.feed(gate_up, h)
        if down is not None:
            step.feed(down, input_of(layer.mlp.down_proj, lambda: layer.mlp(h)))

    if any(observers is not None for observers in observed.values()):
        step.fill(None, observe)
    for group in LAYER_GROUPS:
        step.finish(group, observed[group])
    if not outputs:
        return None
    out = new_store("out", x.shape)
    step.fill(out, lambda a, b: forward(layer, x.read(a, b)))
    return out


def _true_sequential(step: LayerSteps, x: ActivationStore, new_store, outputs: bool):
    # Each group observed on what the quantized groups before it produce. The layer is computed
    # in steps along that order, keeping what later steps reuse (the attention output before
    # o_proj, the residual stream after attention), so the attention runs once, not per group.
    layer = step.layer
    n, t = x.shape[0], x.shape[1]
    _, _, gate_up, down = LAYER_GROUPS
    resid = attention_in_sequence(step, x, new_store)

    step.quantize(gate_up, lambda a, b: layer.mlp_norm(resid.read(a, b)))

    def down_input(a: int, b: int) -> torch.Tensor:
        h = layer.mlp_norm(resid.read(a, b))
        return input_of(layer.mlp.down_proj, lambda: layer.mlp(h))

    step.quantize(down, down_input)
    if not outputs:
        resid.close()
        return None
    return mlp_outputs(step, resid, new_store, (n, t, step.cfg.hidden_size))


def mlp_outputs(step: LayerSteps, resid: ActivationStore, new_store, shape) -> ActivationStore:
    """The layer's outputs from the residual stream after its attention (closed after)."""
    layer = step.layer
    out = new_store("out", shape)

    def output(a: int, b: int) -> torch.Tensor:
        # The same operations as DecoderLayer.forward, so a resumed run's replay matches.
        h = resid.read(a, b)
        return h + layer.mlp(layer.mlp_norm(h))

    step.fill(out, output)
    resid.close()
    return out


def attention_in_sequence(step: LayerSteps, x: ActivationStore, new_store) -> ActivationStore:
    """q,k,v then o quantized true-sequentially; returns the residual stream after the
    quantized attention (a store from ``new_store``)."""
    layer, forward, cfg = step.layer, step.forward, step.cfg
    n, t = x.shape[0], x.shape[1]
    qkv, o = LAYER_GROUPS[:2]

    step.quantize(qkv, lambda a, b: layer.attn_norm(x.read(a, b)))
    attn = new_store("attn", (n, t, cfg.num_heads * cfg.head_dim))  # o_proj's input

    def attention(a: int, b: int) -> torch.Tensor:
        xs = layer.attn_norm(x.read(a, b))
        return input_of(layer.attn.o_proj, lambda: layer.attn(xs, *forward.rope_and_mask(layer)))

    step.fill(attn, attention)
    if step.quantize(o, attn.read):  # a scale folded into v_proj (AWQ): the attention changed
        step.fill(attn, attention)
    resid = new_store("resid", (n, t, cfg.hidden_size))  # the residual stream after attention
    step.fill(resid, lambda a, b: x.read(a, b) + layer.attn.o_proj(attn.read(a, b)))
    attn.close()
    return resid


@dataclass(slots=True)
class Observed:
    """The statistics being gathered for one group's shared input."""

    width: int
    hessian: HessianObserver | None
    channels: ChannelObserver | None
    absmax: AbsMaxObserver | None

    def __call__(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, self.width).to(torch.float32)  # [tokens, K]
        for observer in (self.hessian, self.channels, self.absmax):
            if observer is not None:
                observer(x)

    def inputs(self) -> GroupInputs:
        channels = self.channels
        return GroupInputs(
            hessian=None if self.hessian is None else self.hessian.hessian(),
            mean_abs=None if channels is None else channels.mean_abs(),
            samples=None if channels is None else channels.sample(),
            act_max=None if self.absmax is None else self.absmax.channel_max(),
        )


@dataclass(slots=True)
class LayerSteps:
    """The chunked computations of one layer, with its quantized linears dequantized once."""

    layer: DecoderLayer
    plan: LayerPlan
    forward: LayerForward
    cfg: ModelConfig
    samples: int
    seq_len: int

    @property
    def sequential(self) -> bool:
        """An entry of the plan fits each group to the quantized groups before it (GPTQ)."""
        return any(method_of(e).sequential(e) for e in self.plan.values())

    @property
    def spec(self) -> LayerSpec:
        """What this layer holds (its groups, its folds)."""
        return self.cfg.layer_spec(self.layer.index)

    def chunks(self) -> list[tuple[int, int]]:
        b = self.forward.batch
        return [(a, min(a + b, self.samples)) for a in range(0, self.samples, b)]

    def fill(self, store: ActivationStore | None, compute: Chunks) -> None:
        """store[a:b] = compute(a, b) over every chunk (None: run it for its side effects)."""
        with dequantized(self.layer):
            for a, b in self.chunks():
                result = compute(a, b)
                if store is not None:
                    store.write(a, result)

    def chosen(self, group: tuple[str, ...]) -> list[str]:
        plan = self.plan
        return [n for n in group if n in plan and plan[n].calibrated]

    def observers(self, group: tuple[str, ...]) -> Observed | None:
        """What the group's calibrated linears need observed; None if nothing."""
        chosen = self.chosen(group)
        if not chosen:
            return None
        wanted = Observation.NONE
        for name in chosen:
            wanted |= method_of(self.plan[name]).observes(self.plan[name])
        width = self.layer.get_submodule(group[0]).in_features  # the group shares one input
        device = self.forward.device  # where the layer runs, and its inputs are
        hessian = HessianObserver(width, device) if Observation.HESSIAN in wanted else None
        channels = None
        if Observation.CHANNELS in wanted:
            tokens = CHANNEL_SAMPLE_TOKENS
            channels = ChannelObserver(width, self.samples, self.seq_len, tokens, device)
        absmax = AbsMaxObserver(width, device) if Observation.ABSMAX in wanted else None
        return Observed(width, hessian, channels, absmax)

    @staticmethod
    def feed(observed: Observed | None, x: torch.Tensor) -> None:
        if observed is not None:
            observed(x)

    def quantize(self, group: tuple[str, ...], inputs: Chunks) -> bool:
        """Observe the group's input over every chunk, then quantize it (see `finish`)."""
        observed = self.observers(group)
        if observed is not None:
            self.fill(None, lambda a, b: observed(inputs(a, b)))
        return self.finish(group, observed)

    def finish(self, group: tuple[str, ...], observed: Observed | None) -> bool:
        """Quantize the group's calibrated linears from what was observed. True when a scale
        was folded into the module before the group (its input changed)."""
        if observed is None:
            return False
        with torch.no_grad(), solver_threads(observed.width):
            inputs = observed.inputs()
            scale = self._scale(group, inputs)
            if scale is not None:
                inputs = inputs.scaled(scale)  # what the scaled linears now receive
            for name in self.chosen(group):
                entry, linear = self.plan[name], self.layer.get_submodule(name)
                quantized = method_of(entry).finish(linear, name, entry, inputs)
                replace_module(self.layer, name, quantized)
        return scale is not None

    def _scale(self, group: tuple[str, ...], inputs: GroupInputs) -> torch.Tensor | None:
        """The scale the method selecting every linear of the group folds in before it
        (`QuantMethod.scale_group`); None when it folds none, or when the group's linears are
        not all selected by entries of one method."""
        entries = [self.plan.get(n) for n in group]
        if None in entries or len({e.method for e in entries}) != 1:
            return None
        layer, forward = self.layer, self.forward
        group_view = Group(
            layer,
            group,
            tuple(entries),
            inputs,
            prev={ls: prev for prev, ls in scaling_groups(self.cfg, layer.index)}.get(group),
            norm={linears: norm for norm, linears in self.spec.norm_groups}.get(group),
            seq_len=self.seq_len,
            inspect=lambda x: _inspected_output(layer, group, x, forward),
        )
        return method_of(entries[0]).scale_group(group_view)


def _inspected_output(layer: DecoderLayer, group: tuple[str, ...], x: torch.Tensor, forward):
    """output(ws): what a scale search compares (AWQ's), with the group's linears holding
    ``ws``: the attention block's output for q,k,v, the MLP's for gate,up, else the linear's
    own. x: [S, T, K] the group's input on the sample sequences."""
    linears = [layer.get_submodule(n) for n in group]

    def module() -> torch.Tensor:
        if group == QKV:
            return layer.attn(x, *forward.rope_and_mask(layer))[0]
        if group == GATE_UP:
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
