"""Calibrated quantization of a sparse (mixture-of-experts) decoder layer: its attention as in
a dense layer, then its experts one at a time.

An expert computes only on the tokens the router sends it, so its statistics (GPTQ's
Hessian, AWQ's channel magnitudes, static FP8's ranges) come from those tokens, routed by the
float router on the layer's own inputs. A rarely chosen expert may see almost none: a Hessian
of fewer tokens than its input width is singular: GPTQ fits the handful of tokens it has, and
with none (an all-zero Hessian) treats every channel as dead and zeroes the weights. The rule:

- ``routed``: the expert saw at least `min_routed_tokens` tokens (its widest input: hidden or
  the experts' intermediate width): statistics from its routed tokens only.
- ``all_tokens``: it saw fewer (none included): statistics from every calibration token sent
  through it, as llm-compressor's MoE calibration does for every expert (its outputs are
  then not part of the layer's output: the walk computes that with the real routing).

Each calibrated expert's record ({"routed_tokens", "statistics": the rule}) goes to
quantize.json under the entries that quantized it. The routes are computed once per layer
(the router is float: quantizing experts changes none); each expert's passes read the residual
stream again and dequantize that expert only, so the walk's cost grows with the experts'
count, not its square; one expert's observers are alive at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ingot.calibration.activations import ActivationStore
from ingot.calibration.capture import input_of

from ..model.config import ModelConfig
from ..model.layers import DecoderLayer
from ..model.qlinear import dequantized
from .layerwise import (
    LayerForward,
    LayerPlan,
    LayerSteps,
    Observed,
    attention_in_sequence,
    mlp_outputs,
)

__all__ = ["ALL_TOKENS", "ROUTED", "min_routed_tokens", "quantize_sparse_layer"]

ROUTED, ALL_TOKENS = "routed", "all_tokens"


def min_routed_tokens(cfg: ModelConfig) -> int:
    """The fewest routed tokens an expert is calibrated on alone: its widest input, below
    which one of its Hessians cannot have full rank."""
    return max(cfg.hidden_size, cfg.expert_intermediate_size)


def quantize_sparse_layer(
    layer: DecoderLayer,
    x: ActivationStore,
    plan: LayerPlan,
    forward: LayerForward,
    cfg: ModelConfig,
    new_store: Callable[[str, tuple[int, ...]], ActivationStore],
    *,
    outputs: bool = True,
    experts: dict[str, dict] | None = None,
) -> ActivationStore | None:
    """`layerwise.quantize_layer` for a layer whose MLP is a `SparseMoE`; each calibrated
    expert's record goes in ``experts`` ({its IR prefix: its routed tokens and the rule})."""
    step = LayerSteps(layer, plan, forward, cfg, x.shape[0], x.shape[1])
    sequential = step.sequential
    if sequential:
        resid = attention_in_sequence(step, x, new_store)
    else:
        resid = _attention_as_loaded(step, x, new_store)
    routes = _routes(step, resid)  # per chunk: [tokens, top_k] the experts each token chose
    counts = torch.bincount(torch.cat(routes).flatten(), minlength=len(step.layer.mlp.experts))
    least = min_routed_tokens(step.cfg)
    for e, count in enumerate(counts.tolist()):
        rule = ROUTED if count >= least else ALL_TOKENS
        calibrated = _calibrate_expert(step, resid, routes, e, rule == ALL_TOKENS, sequential)
        if calibrated and experts is not None:
            name = f"layers.{step.layer.index}.mlp.experts.{e}"
            experts[name] = {"routed_tokens": count, "statistics": rule}
    if not outputs:
        resid.close()
        return None
    if sequential:
        return mlp_outputs(step, resid, new_store, x.shape)
    resid.close()  # observed on the layer as loaded; the outputs are the quantized layer's
    out = new_store("out", x.shape)
    step.fill(out, lambda a, b: step.forward(step.layer, x.read(a, b)))
    return out


def _attention_as_loaded(step: LayerSteps, x: ActivationStore, new_store) -> ActivationStore:
    """q,k,v and o observed in one pass on the layer as loaded, then quantized; returns the
    residual stream after the attention as loaded (what the experts are observed on)."""
    layer, forward = step.layer, step.forward
    qkv, o = step.spec.groups[:2]
    observed_qkv, observed_o = step.observers(qkv), step.observers(o)
    resid = new_store("resid", x.shape)

    def observe(a: int, b: int) -> torch.Tensor:
        xs = x.read(a, b)
        normed = layer.attn_norm(xs)
        step.feed(observed_qkv, normed)
        attn = input_of(
            layer.attn.o_proj, lambda: layer.attn(normed, *forward.rope_and_mask(layer))
        )
        step.feed(observed_o, attn)
        return xs + layer.attn.o_proj(attn)

    step.fill(resid, observe)
    step.finish(qkv, observed_qkv)
    step.finish(o, observed_o)
    return resid


def _mlp_inputs(step: LayerSteps, resid: ActivationStore, a: int, b: int) -> torch.Tensor:
    """[tokens, hidden]: the MLP's input (what the router and every expert read)."""
    h = step.layer.mlp_norm(resid.read(a, b))
    return h.reshape(-1, h.shape[-1])


def _routes(step: LayerSteps, resid: ActivationStore) -> list[torch.Tensor]:
    """Per chunk, [tokens, top_k] int64 (on the CPU): the experts the router sends each
    calibration token to. Computed once per layer: the router and the norm before it are
    float, so quantizing the experts changes no route."""
    moe = step.layer.mlp
    with torch.no_grad():  # nothing to dequantize
        return [moe.route(_mlp_inputs(step, resid, a, b))[1].cpu() for a, b in step.chunks()]


def _calibrate_expert(
    step: LayerSteps,
    resid: ActivationStore,
    routes: list[torch.Tensor],
    e: int,
    all_tokens: bool,
    sequential: bool,
) -> bool:
    """Quantize expert e's calibrated linears (gate,up, then down) on its tokens (every
    token with `all_tokens`); False when the plan calibrates none of them."""
    moe = step.layer.mlp
    expert = moe.experts[e]
    prefix = f"mlp.experts.{e}."
    gate_up, down = (f"{prefix}gate_proj", f"{prefix}up_proj"), (f"{prefix}down_proj",)
    if not step.chosen(gate_up) and not step.chosen(down):
        return False

    def observe(gu: Observed | None, dn: Observed | None) -> None:
        with dequantized(expert):  # this expert only: the router stays float
            for (a, b), chosen in zip(step.chunks(), routes, strict=True):
                h = _mlp_inputs(step, resid, a, b)  # [tokens, hidden]
                rows = None if all_tokens else (chosen == e).any(-1).nonzero()[:, 0]
                rows = None if rows is None else rows.to(h.device)
                xe = h if rows is None else h[rows]  # [routed, hidden]
                _feed(gu, xe, rows, len(h))
                if dn is not None:
                    _feed(dn, input_of(expert.down_proj, lambda x=xe: expert(x)), rows, len(h))

    observed_gu = step.observers(gate_up)
    observed_down = None if sequential else step.observers(down)
    if observed_gu is not None or observed_down is not None:
        observe(observed_gu, observed_down)
    step.finish(gate_up, observed_gu)
    if sequential:  # down observed on what the quantized gate,up produce
        observed_down = step.observers(down)
        if observed_down is not None:
            observe(None, observed_down)
    step.finish(down, observed_down)
    return True


def _feed(observed: Observed | None, xe: torch.Tensor, rows: torch.Tensor | None, n: int):
    """Observe an expert's input xe [routed, K], the rows `rows` of a chunk of n tokens (None:
    all of them). The Hessian and the ranges take the routed rows; AWQ's channel observer,
    which keeps whole sample sequences, takes the chunk with the other rows zero (they add
    nothing to its error searches; its mean magnitudes scale by one factor for all
    channels, which its normalised scales do not see)."""
    if observed is None:
        return
    xe = xe.reshape(-1, observed.width).to(torch.float32)
    if len(xe):
        for observer in (observed.hessian, observed.absmax):
            if observer is not None:
                observer(xe)
    if observed.channels is not None:
        full = xe if rows is None else xe.new_zeros(n, observed.width).index_copy_(0, rows, xe)
        observed.channels(full)
