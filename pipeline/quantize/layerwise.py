"""Calibrated quantization (GPTQ, AWQ, SmoothQuant W8A8, static FP8 inputs) of one
Llama-family decoder layer.

The linears are quantized group by group in the order their inputs are computed:
q,k,v -> o -> gate,up -> down. With ``true_sequential`` (GPTQ's default) each group is fitted to
the inputs the already quantized groups before it produce; the layer is then computed in steps
along that order, keeping what later steps reuse (the attention output before o_proj, the
residual stream after attention), so the attention runs once. Otherwise (AWQ, or GPTQ with
``true_sequential: false``) every group's input is observed in one pass over the layer as
loaded, as llm-compressor and AutoAWQ do. Either way the layer's outputs are bit-identical to
a plain forward of the finished layer (the same operations on the same chunks), which is what
a resumed run replays. The driver (`driver.py`) applies the layer's RTN entries before, and
runs this layer by layer.

Everything here runs on the layer's device (`LayerForward.device`; the driver moves the layer
there): the chunks arrive there from the activation stores, the observers accumulate there and
GPTQ / AWQ solve there, so the quantized linears are made on that device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ingot.calibration.activations import ActivationStore
from ingot.calibration.capture import AbsMaxObserver, ChannelObserver, HessianObserver, input_of

from ..model.architecture import GATE_UP, LAYER_GROUPS, NORM_GROUPS, QKV, scaling_groups
from ..model.config import ModelConfig
from ..model.input_quant import InputQuant
from ..model.layers import DecoderLayer
from ..model.llama import causal_mask
from ..model.qlinear import QuantizedLinear, dequantize_in_place, dequantized, replace_module
from ..model.rope import cos_sin
from ..model.selection import entry_for
from ..recipe.quantize import GptqQuantize, Quantize, SmoothQuantQuantize
from .awq import apply_scales, quantize_linear_awq, search_scales
from .gptq import quantize_linear_gptq
from .rtn import quantize_linear_rtn
from .smoothquant import smoothed_hessian, smoothing_scales
from .threads import solver_threads

__all__ = [
    "AWQ_SAMPLE_TOKENS",
    "LayerForward",
    "LayerPlan",
    "dequantized_for_propagation",
    "layer_plan",
    "needs_calibration",
    "quantize_layer",
]

AWQ_SAMPLE_TOKENS = 4096  # about this many tokens (whole samples) for AWQ's error searches
_CHUNK_BYTES = 64 * 2**20  # widest intermediate of one forward chunk


# {linear name inside a layer: the quantize entry selecting it}, in compute order.
LayerPlan = dict[str, Quantize]


def needs_calibration(entries: Sequence[Quantize]) -> bool:
    return any(entry.calibrated for entry in entries)


def layer_plan(i: int, entries: Sequence[Quantize]) -> LayerPlan:
    """Which entry quantizes each linear of layer i (the recipe checks allow one)."""
    plan = {}
    for group in LAYER_GROUPS:
        for name in group:
            entry = entry_for(f"layers.{i}.{name}", entries)
            if entry is not None:
                plan[name] = entry
    return plan


@dataclass(slots=True)
class LayerForward:
    """Runs a decoder layer on [B, T, hidden] calibration activations (positions 0..T-1), on
    ``device`` (where the layer and the activations it is given are)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
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
        mask = causal_mask(positions, positions, cfg.sliding_window)  # [1, 1, T, T]
        widest = max(cfg.hidden_size * 4, cfg.intermediate_size * 3, cfg.num_heads * seq_len)
        batch = max(1, min(samples, _CHUNK_BYTES // (seq_len * widest * 4)))
        return cls(cos.to(device), sin.to(device), mask.to(device), batch, device)

    @property
    def rope_and_mask(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cos, self.sin, self.mask

    def __call__(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer(x, *self.rope_and_mask)[0]


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

    True-sequentially when a GPTQ entry of the plan asks for it (the default); otherwise
    every group is observed on the layer as loaded, in one pass."""
    step = _Steps(layer, plan, forward, cfg, x.shape[0], x.shape[1])
    if any(isinstance(e, GptqQuantize) and e.true_sequential for e in plan.values()):
        return _true_sequential(step, x, new_store, outputs)
    return _observe_once(step, x, new_store, outputs)


def _observe_once(step: _Steps, x: ActivationStore, new_store, outputs: bool):
    layer, forward = step.layer, step.forward
    observed = {group: step.observers(group) for group in LAYER_GROUPS}
    qkv, o, gate_up, down = (observed[g] for g in LAYER_GROUPS)

    def observe(a: int, b: int) -> None:
        xs = x.read(a, b)
        normed = layer.attn_norm(xs)
        step.feed(qkv, normed)
        attn = input_of(layer.attn.o_proj, lambda: layer.attn(normed, *forward.rope_and_mask))
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


def _true_sequential(step: _Steps, x: ActivationStore, new_store, outputs: bool):
    # Each group observed on what the quantized groups before it produce. The layer is computed
    # in steps along that order, keeping what later steps reuse (the attention output before
    # o_proj, the residual stream after attention), so the attention runs once, not per group.
    layer, forward, cfg = step.layer, step.forward, step.cfg
    n, t = x.shape[0], x.shape[1]
    qkv, o, gate_up, down = LAYER_GROUPS

    step.quantize(qkv, lambda a, b: layer.attn_norm(x.read(a, b)))
    attn = new_store("attn", (n, t, cfg.num_heads * cfg.head_dim))  # o_proj's input

    def attention(a: int, b: int) -> torch.Tensor:
        xs = layer.attn_norm(x.read(a, b))
        return input_of(layer.attn.o_proj, lambda: layer.attn(xs, *forward.rope_and_mask))

    step.fill(attn, attention)
    if step.quantize(o, attn.read):  # AWQ folded 1/s into v_proj: the attention changed
        step.fill(attn, attention)
    resid = new_store("resid", (n, t, cfg.hidden_size))  # the residual stream after attention
    step.fill(resid, lambda a, b: x.read(a, b) + layer.attn.o_proj(attn.read(a, b)))
    attn.close()

    step.quantize(gate_up, lambda a, b: layer.mlp_norm(resid.read(a, b)))

    def down_input(a: int, b: int) -> torch.Tensor:
        h = layer.mlp_norm(resid.read(a, b))
        return input_of(layer.mlp.down_proj, lambda: layer.mlp(h))

    step.quantize(down, down_input)
    if not outputs:
        resid.close()
        return None
    out = new_store("out", (n, t, cfg.hidden_size))

    def output(a: int, b: int) -> torch.Tensor:
        # The same operations as DecoderLayer.forward, so a resumed run's replay matches.
        h = resid.read(a, b)
        return h + layer.mlp(layer.mlp_norm(h))

    step.fill(out, output)
    resid.close()
    return out


@dataclass(slots=True)
class _Observed:
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


@dataclass(slots=True)
class _Steps:
    """The chunked computations of one layer, with its quantized linears dequantized once."""

    layer: DecoderLayer
    plan: LayerPlan
    forward: LayerForward
    cfg: ModelConfig
    samples: int
    seq_len: int

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

    def _chosen(self, group: tuple[str, ...]) -> list[str]:
        plan = self.plan
        return [n for n in group if n in plan and plan[n].calibrated]

    def observers(self, group: tuple[str, ...]) -> _Observed | None:
        """What the group's calibrated linears need observed; None if nothing."""
        chosen = self._chosen(group)
        if not chosen:
            return None
        entries = [self.plan[n] for n in chosen]
        methods = {e.method for e in entries}
        width = self.layer.get_submodule(group[0]).in_features  # the group shares one input
        device = self.forward.device  # where the layer runs, and its inputs are
        gptq = "gptq" in methods or any(_gptq_weights(e) for e in entries)
        hessian = HessianObserver(width, device) if gptq else None
        channels = None
        if "awq" in methods:
            channels = ChannelObserver(width, self.samples, self.seq_len, AWQ_SAMPLE_TOKENS, device)
        # Activation ranges: SmoothQuant's scales, and static input scales (smoothquant, fp8).
        absmax = AbsMaxObserver(width, device) if methods & {"smoothquant", "fp8"} else None
        return _Observed(width, hessian, channels, absmax)

    @staticmethod
    def feed(observed: _Observed | None, x: torch.Tensor) -> None:
        if observed is not None:
            observed(x)

    def quantize(self, group: tuple[str, ...], inputs: Chunks) -> bool:
        """Observe the group's input over every chunk, then quantize it (see `finish`)."""
        observed = self.observers(group)
        if observed is not None:
            self.fill(None, lambda a, b: observed(inputs(a, b)))
        return self.finish(group, observed)

    def finish(self, group: tuple[str, ...], observed: _Observed | None) -> bool:
        """Quantize the group's calibrated linears from what was observed. True when an AWQ
        scale was folded into the module before the group."""
        if observed is None:
            return False
        x, scale = None, None
        with torch.no_grad(), solver_threads(observed.width):
            if observed.channels is not None:
                x = observed.channels.sample()  # [S * T, K]
                scale = self._awq_scale(group, observed.channels, x)
                if scale is not None:
                    x = x / scale  # what the scaled linears now receive
            h = None if observed.hessian is None else observed.hessian.hessian()
            act_max = None if observed.absmax is None else observed.absmax.channel_max()  # [K]
            smooth = self._smooth(group, act_max)
            if smooth is not None:
                act_max = act_max / smooth  # the ranges of what the smoothed linears receive
                h = None if h is None else smoothed_hessian(h, smooth)
            for name in self._chosen(group):
                linear, entry = self.layer.get_submodule(name), self.plan[name]
                if not isinstance(linear, QuantizedLinear):  # fp8's weights are rounded already
                    linear = _quantize_one(linear, name, entry, h, x)
                    replace_module(self.layer, name, linear)
                if act_max is not None:
                    _set_input_scale(linear, entry, act_max)
        return scale is not None

    def _smooth(self, group: tuple[str, ...], act_max: torch.Tensor | None) -> torch.Tensor | None:
        """Fold SmoothQuant's scales into the norm before ``group`` and return them; None when
        the group is not smoothed (not fed by a norm: o_proj, down_proj; or not all of its
        linears smoothquant entries with one alpha)."""
        entries = [self.plan.get(n) for n in group]
        if act_max is None or not all(isinstance(e, SmoothQuantQuantize) for e in entries):
            return None
        alphas = {e.alpha for e in entries}
        norm_name = {linears: norm for norm, linears in NORM_GROUPS}.get(group)
        if len(alphas) != 1 or None in alphas or norm_name is None:
            return None
        norm = self.layer.get_submodule(norm_name)
        linears = [self.layer.get_submodule(n) for n in group]
        s = smoothing_scales(act_max, [m.weight.data for m in linears], alphas.pop())
        apply_scales(norm, linears, s)
        return s

    def _awq_scale(
        self, group: tuple[str, ...], channels: ChannelObserver, x: torch.Tensor
    ) -> torch.Tensor | None:
        """Search the group's AWQ scale and fold it in; None when the group is not scaled
        (GQA for v -> o, or a linear of the group not selected by AWQ)."""
        prev = {linears: prev for prev, linears in scaling_groups(self.cfg)}.get(group)
        if prev is None or any(n not in self.plan or self.plan[n].method != "awq" for n in group):
            return None
        linears = [self.layer.get_submodule(n) for n in group]
        samples = x.view(-1, self.seq_len, x.shape[-1])  # [S, T, K]: whole sequences
        s = search_scales(
            channels.mean_abs(),
            [m.weight.data for m in linears],
            [self.plan[n].quantizer for n in group],
            _inspected_output(self.layer, group, samples, self.forward),
        )
        apply_scales(self.layer.get_submodule(prev), linears, s)
        return s


def _inspected_output(layer: DecoderLayer, group: tuple[str, ...], x: torch.Tensor, forward):
    """output(ws): what AWQ's scale search compares, with the group's linears holding ``ws``:
    the attention block's output for q,k,v, the MLP's for gate,up, else the linear's own.
    x: [S, T, K] the group's input on the sample sequences."""
    linears = [layer.get_submodule(n) for n in group]

    def module() -> torch.Tensor:
        if group == QKV:
            return layer.attn(x, *forward.rope_and_mask)[0]
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


def _gptq_weights(entry: Quantize) -> bool:
    return isinstance(entry, SmoothQuantQuantize) and entry.weights == "gptq"


def _set_input_scale(linear: QuantizedLinear, entry: Quantize, act_max: torch.Tensor) -> None:
    """The input scheme of a W8A8 linear, and the scale of a static one: max |x| over the
    calibration tokens and channels, mapped to the dtype's largest value."""
    if isinstance(entry, SmoothQuantQuantize):
        scheme = InputQuant("int8", static=entry.activations == "static")
    else:
        scheme = linear.input_quant
    if scheme is not None and scheme.static:
        peak = float(act_max.max())
        scheme = InputQuant(scheme.dtype, True, max(peak, 1e-8) / scheme.max_value)
    linear.set_input_quant(scheme)


def _quantize_one(linear: nn.Linear, name: str, entry: Quantize, hessian, x) -> QuantizedLinear:
    if isinstance(entry, SmoothQuantQuantize):  # int8 symmetric per-channel weights
        if entry.weights == "rtn":
            return quantize_linear_rtn(linear, *entry.quantizer)
        return _gptq(linear, hessian, *entry.quantizer, GptqQuantize.model_construct())
    bits, group_size, symmetric = entry.quantizer
    common = {"bits": bits, "group_size": group_size, "symmetric": symmetric}
    if isinstance(entry, GptqQuantize):
        return _gptq(linear, hessian, bits, group_size, symmetric, entry)
    return quantize_linear_awq(linear, x, name=name, **common)


def _gptq(linear, hessian, bits: int, group_size: int, symmetric: bool, options: GptqQuantize):
    """GPTQ with ``options``' settings (a smoothquant entry passes GPTQ's defaults)."""
    return quantize_linear_gptq(
        linear,
        hessian,
        bits=bits,
        group_size=group_size,
        symmetric=symmetric,
        actorder=options.actorder,
        static_groups=options.static_groups,
        dampening_frac=options.dampening_frac,
        block_size=options.block_size,
        group_scales=options.group_scales,
    )
