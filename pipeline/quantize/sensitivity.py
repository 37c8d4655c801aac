"""Each unit's sensitivity to each candidate entry, measured directly: the mean KL (per token,
on the calibration windows) of the model's next-token distributions from the float model's,
when only that unit's linears take the candidate and everything else stays float.

A unit (units.py) is the selected linears of one compute group of one layer.

The unit's quantized weights come from the candidate's own method through the layer walk's own
code (`layerwise.round_linears`, then `quantize_layer` for a method that observes its inputs):
GPTQ solves with the Hessian of the unit's float inputs on the calibration windows, AWQ
searches its scales and folds them into a copy of the layer, SmoothQuant smooths; no RTN
stand-in. Only the trial layer is copied: the float inputs of every layer holding a unit are
computed once and kept (activation stores, spilled past the budget), then each trial runs its
layer and the float layers after it, chunk by chunk, to the logits, scored against the float
logits of the same chunk by `evaluate.kl.kl_sum` (the one KL).

Cost: one float forward of the model (the inputs), then per (unit, candidate) the unit's layer
once (plus what its method's walk does: GPTQ's true-sequential steps, AWQ's grid search), the
layers after it and the final norm and lm_head twice (the trial's and the float logits).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ingot.calibration.activations import ActivationSpace, ActivationStore, budget_from_env
from ingot.calibration.dataset import CalibrationSet

from ..evaluate.kl import kl_sum
from ..model.config import ModelConfig
from ..model.layer_source import LayerSource
from ..model.qlinear import dequantized
from .decoder_layer import quantize_decoder_layer
from .driver import full_float32
from .layerwise import LayerForward, round_linears
from .method import QuantEntry
from .units import Unit

__all__ = ["measure_kl"]

# Progress: on_trial(unit index, candidate index, mean KL).
OnTrial = Callable[[int, int, float], None]


def measure_kl(
    source: LayerSource,
    calibration: CalibrationSet,
    units: Sequence[Unit],
    candidates: Sequence[QuantEntry],
    *,
    device: str = "cpu",
    on_trial: OnTrial | None = None,
) -> np.ndarray:
    """[units, candidates] mean KL per token (nats) of the model with only that unit quantized
    by that candidate, from the float model, on the calibration windows."""
    tokens = torch.as_tensor(calibration.tokens)  # [N, T]
    n, t = tokens.shape
    cfg = source.cfg
    forward = LayerForward.for_config(cfg, n, t, device)
    kl = np.zeros((len(units), len(candidates)))
    with tempfile.TemporaryDirectory(prefix="ingot-precision-") as tmp, full_float32():
        held = 2 + len({u.layer for u in units})  # the inputs kept, a trial's 3 stores
        space = ActivationSpace(Path(tmp), budget_from_env() * 3 // (held + 3), device)
        model = _FloatModel.load(source, tokens, forward, space, {u.layer for u in units})
        try:
            for a, unit in enumerate(units):
                for c, candidate in enumerate(candidates):
                    kl[a, c] = model.trial(unit, candidate) / (n * t)
                    if on_trial is not None:
                        on_trial(a, c, float(kl[a, c]))
        finally:
            model.close()
    return kl


@dataclass(slots=True)
class _FloatModel:
    """The float layers (on the device), the final norm and lm_head, and the float inputs of
    the layers that hold units (``inputs``) and of the final norm (``final``)."""

    cfg: ModelConfig
    layers: list[nn.Module]
    head: nn.Module  # final norm -> lm_head
    forward: LayerForward
    space: ActivationSpace
    inputs: dict[int, ActivationStore]
    final: ActivationStore
    reference: dict[int, np.ndarray]  # the float logits [B * T, V] by chunk, if they fit

    @classmethod
    def load(
        cls,
        source: LayerSource,
        tokens: torch.Tensor,
        forward: LayerForward,
        space: ActivationSpace,
        keep: set[int],
    ) -> _FloatModel:
        cfg, device = source.cfg, forward.device
        layers = [source.layer(i).to(device) for i in range(cfg.num_layers)]
        head = nn.Sequential(source.final_norm(), source.lm_head()).to(device)
        shape = (*tokens.shape, cfg.hidden_size)
        x = space.store("embed", shape)
        table = source.embedding()
        for a, b in _chunks(len(tokens), forward.batch):
            x.write(a, nn.functional.embedding(tokens[a:b], table))
        inputs = {}
        for i, layer in enumerate(layers):
            out = space.store(f"in-{i + 1}", shape)
            with torch.inference_mode():
                for a, b in _chunks(len(tokens), forward.batch):
                    out.write(a, forward(layer, x.read(a, b)))
            if i in keep:
                inputs[i] = x
            else:
                x.close()
            x = out
        model = cls(cfg, layers, head, forward, space, inputs, x, {})
        # The float logits are the same for every trial: kept when they fit in a quarter of the
        # space's share of the activation budget (16 x 256 tokens x 4096 vocabulary: 64 MiB of
        # the default 4 GiB's share), else recomputed per trial.
        if x.shape[0] * x.shape[1] * cfg.vocab_size * 4 <= space.budget_bytes // 4:
            model.reference = {a: model._reference(a, b) for a, b in model._chunks()}
        return model

    def trial(self, unit: Unit, candidate: QuantEntry) -> float:
        """Summed KL over every token with only ``unit`` quantized by ``candidate``."""
        x, forward = self.inputs[unit.layer], self.forward
        layer = copy.deepcopy(self.layers[unit.layer]).to("cpu")
        plan = {name: candidate for name in unit.names}
        round_linears(layer, plan)  # on the CPU, as the driver does
        layer.to(forward.device)
        if candidate.calibrated:
            stores = lambda name, shape: self.space.store(f"trial-{name}", shape)  # noqa: E731
            out = quantize_decoder_layer(layer, x, plan, forward, self.cfg, stores, outputs=True)
            read, close = out.read, out.close
        else:
            read, close = x.read, lambda: None
        # A calibrated trial's walk already computed the layer's outputs; a rounded one runs it.
        after = [None if candidate.calibrated else layer, *self.layers[unit.layer + 1 :]]
        try:
            with dequantized(layer), torch.inference_mode():
                return sum(self._kl(read, after, a, b) for a, b in self._chunks())
        finally:
            close()

    def _kl(self, read, after: list[nn.Module | None], a: int, b: int) -> float:
        """KL of chunk [a, b): ``read(a, b)`` through ``after`` (None: already applied) and
        the head, against the float logits."""
        h = read(a, b)
        for layer in after:
            if layer is not None:
                h = self.forward(layer, h)
        logits = self.head(h).reshape(-1, self.cfg.vocab_size)  # [B * T, V]
        reference = self.reference[a] if a in self.reference else self._reference(a, b)
        return kl_sum(reference, logits.float().cpu().numpy())

    def _reference(self, a: int, b: int) -> np.ndarray:
        """The float model's logits [B * T, V] of chunk [a, b)."""
        with torch.inference_mode():
            logits = self.head(self.final.read(a, b)).reshape(-1, self.cfg.vocab_size)
        return logits.float().cpu().numpy()

    def _chunks(self) -> list[tuple[int, int]]:
        return _chunks(len(self.final), self.forward.batch)

    def close(self) -> None:
        for store in (*self.inputs.values(), self.final):
            store.close()


def _chunks(total: int, batch: int) -> list[tuple[int, int]]:
    return [(a, min(a + batch, total)) for a in range(0, total, batch)]
