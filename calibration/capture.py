"""Observing the inputs of a layer's linears while the layer runs on calibration activations.

`input_of` runs a computation up to one module and returns that module's input (nothing after
it is needed to learn it). The observers accumulate, over every chunk of inputs [tokens, K],
what the quantizers need:
`HessianObserver` for GPTQ (H = 2/n sum of x x^T), `ChannelObserver` for AWQ (mean |x| per
input channel and a fixed subset of whole samples for its error searches). They accumulate on
the ``device`` they are made for, the one the layer runs on, which is where its inputs come.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["AbsMaxObserver", "ChannelObserver", "HessianObserver", "StopForward", "input_of"]

_BLOCK = 256  # least channels per block row of the Hessian: narrower products are slower


class StopForward(Exception):
    """Raised by the hook once the observed input is recorded: the rest of the forward is
    wasted work."""


def input_of(module: nn.Module, run: Callable[[], object]) -> torch.Tensor:
    """The input ``module`` receives while ``run()`` executes; the computation stops there."""
    seen: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple) -> None:
        seen.append(args[0])
        raise StopForward

    handle = module.register_forward_pre_hook(hook)
    try:
        run()
    except StopForward:
        pass
    finally:
        handle.remove()
    if not seen:
        raise RuntimeError(f"{type(module).__name__} was not called")
    return seen[0]


class HessianObserver:
    """GPTQ's Hessian of the layer-wise squared error: H = 2/n * sum over tokens of x x^T.

    H is symmetric, so only its upper triangle is accumulated, in block rows of at least
    ``_BLOCK`` channels: block row i is x[:, i]^T x[:, i:], which skips the blocks below the
    diagonal: for K = 1024 (an MLP's down_proj) 10 of 16 blocks, 5/8 of the flops of the
    largest product of calibration. Inputs narrower than 2 blocks stay one product."""

    __slots__ = ("_sum", "_count")

    def __init__(self, in_features: int, device: torch.device | str = "cpu") -> None:
        self._sum = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)
        self._count = 0

    def __call__(self, x: torch.Tensor) -> None:
        k = x.shape[1]  # x: [tokens, K]
        edges = torch.linspace(0, k, max(1, k // _BLOCK) + 1).round().long().tolist()
        for i, j in itertools.pairwise(edges):
            self._sum[i:j, i:].addmm_(x[:, i:j].T, x[:, i:])  # block row, from the diagonal
        self._count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        """[K, K] float32."""
        upper = torch.triu(self._sum)
        return (upper + torch.triu(upper, diagonal=1).T) * (2.0 / max(self._count, 1))


class ChannelObserver:
    """AWQ's activation statistics: mean |x| per input channel over every token, and the rows
    of a fixed, evenly spaced subset of whole samples (sequences) holding about
    ``sample_tokens`` tokens, on which AWQ measures the error of its candidates."""

    __slots__ = ("_abs_sum", "_count", "_rows", "_picked", "sample_sequences")

    def __init__(
        self,
        in_features: int,
        samples: int,
        seq_len: int,
        sample_tokens: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self._abs_sum = torch.zeros(in_features, dtype=torch.float64, device=device)
        self._count = 0
        keep = max(1, min(samples, -(-sample_tokens // seq_len)))
        chosen = torch.linspace(0, samples - 1, keep).round().long().unique()
        self.sample_sequences = len(chosen)
        rows = (chosen[:, None] * seq_len + torch.arange(seq_len)).flatten()
        self._rows = rows.to(device)
        self._picked: list[torch.Tensor] = []

    def __call__(self, x: torch.Tensor) -> None:
        start, stop = self._count, self._count + x.shape[0]
        self._abs_sum += x.abs().sum(0, dtype=torch.float64)
        rows = self._rows[(self._rows >= start) & (self._rows < stop)] - start
        self._picked.append(x[rows].clone())
        self._count = stop

    def mean_abs(self) -> torch.Tensor:
        """[K] float32."""
        return (self._abs_sum / max(self._count, 1)).to(torch.float32)

    def sample(self) -> torch.Tensor:
        """[S * T, K] float32: the chosen samples' token rows, in order."""
        return torch.cat(self._picked)


class AbsMaxObserver:
    """max |x| per input channel over every token: SmoothQuant's activation ranges and the
    per-tensor scale of static activation quantization (its max over channels)."""

    __slots__ = ("_max",)

    def __init__(self, in_features: int, device: torch.device | str = "cpu") -> None:
        self._max = torch.zeros(in_features, dtype=torch.float32, device=device)

    def __call__(self, x: torch.Tensor) -> None:
        torch.maximum(self._max, x.abs().amax(0), out=self._max)  # x: [tokens, K]

    def channel_max(self) -> torch.Tensor:
        """[K] float32."""
        return self._max.clone()
