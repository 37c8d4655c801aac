"""The layer-sequential runner: layer i is quantized on the activations the *quantized* layers
0..i-1 produce, then its own quantized outputs become layer i+1's inputs.

Only one decoder layer's weights and two activation stores (this layer's inputs and outputs)
are alive at a time, so peak memory is about one layer plus the activations, whatever the depth.
The runner knows nothing about the model family: the caller hands it how to quantize layer i
(load its float weights, observe, quantize, write its checkpoint) and how to load a finished
layer back.

Checkpoints make a killed run resumable: when layer i's checkpoint is written, ``layer_{i}.done``
marks it finished. A resumed run replays the forward passes of the finished layers (loaded from
their checkpoints, no observation, no quantization) to rebuild the inputs of the first
unfinished one. The quantizer computes a layer's outputs with the same operations on the same
chunks as that replay, so a resumed run sees bit-identical activations and writes
bit-identical layers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .activations import ActivationStore

__all__ = ["LayerCheckpoints", "run_layers", "propagate"]


@dataclass(frozen=True, slots=True)
class LayerCheckpoints:
    """``<root>/layer_{i}.*`` files of finished layers; ``layer_{i}.done`` is written last."""

    root: Path

    def stem(self, i: int) -> Path:
        return self.root / f"layer_{i}"

    def done(self, i: int) -> bool:
        return (self.root / f"layer_{i}.done").exists()

    def mark_done(self, i: int) -> None:
        marker = self.root / f"layer_{i}.done"
        tmp = marker.with_suffix(".done-tmp")
        tmp.write_text("")
        os.replace(tmp, marker)


def propagate(
    layer: nn.Module,
    inputs: ActivationStore,
    outputs: ActivationStore,
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    batch: int,
) -> None:
    """outputs[s] = forward(layer, inputs[s]) for every sample, ``batch`` samples at a time."""
    with torch.inference_mode():
        for start in range(0, len(inputs), batch):
            stop = min(start + batch, len(inputs))
            outputs.write(start, forward(layer, inputs.read(start, stop)))


def run_layers(
    num_layers: int,
    first_inputs: Callable[[], ActivationStore],
    *,
    quantize_layer: Callable[[int, ActivationStore, bool], ActivationStore | None],
    load_layer: Callable[[int], nn.Module],
    new_store: Callable[[int], ActivationStore],
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    batch: int,
    checkpoints: LayerCheckpoints | None = None,
    on_layer: Callable[[int, str], None] | None = None,
) -> None:
    """Quantize layers 0..num_layers-1 in order.

    first_inputs()          the inputs of layer 0 (the embeddings of the calibration tokens)
    quantize_layer(i, x, keep)  quantize layer i on its inputs x, write its checkpoint, and
                            return the quantized layer's outputs (None when keep is False: the
                            last layer's outputs feed nothing, so they are not computed)
    load_layer(i)           a finished layer, loaded back from its checkpoint (to replay it)
    new_store(i)            an empty store for a replayed layer i's outputs
    on_layer(i, event)      progress: "quantized" or "resumed"
    """
    done = [checkpoints is not None and checkpoints.done(i) for i in range(num_layers)]
    if all(done):
        return
    x = first_inputs()
    for i in range(num_layers):
        if done[i]:
            if on_layer is not None:
                on_layer(i, "resumed")
            if all(done[i + 1 :]):
                break  # nothing after this layer needs its outputs
            outputs = new_store(i)
            propagate(load_layer(i), x, outputs, forward, batch)
        else:
            outputs = quantize_layer(i, x, i + 1 < num_layers)
            if checkpoints is not None:
                checkpoints.mark_done(i)
            if on_layer is not None:
                on_layer(i, "quantized")
            if outputs is None:
                break
        x.close()
        x = outputs
    x.close()
