"""Self-distillation of Medusa heads against the quantized target (speculative.heads.train).

The target here is the quantize stage's IR, the model the artifact ships (its weights as
quantized; the engine's own int8 activation rounding is not modelled). Its final hidden states
over the calibration windows are computed once, layer by layer (one decoder layer in memory at
a time, every window's activations kept: windows x seq_len x hidden floats). Each step then
draws `batch_size` (window, position t) pairs and trains every head h on
KL(p_target(t+h+1) || q_h(t)): the target's own next-token distribution h+1 positions further
on, from hidden[t]. The teacher logits come from the target's lm_head on the fly, so no
[windows x seq_len x vocab] tensor is ever held.

Resumable: every `CHECKPOINT_EVERY` steps the heads, AdamW's state, the step and the position
sampler's RNG go to the work directory; a crashed build resumes there and ends with the same
weights as an uninterrupted one (same draws, same updates).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..model.layer_source import LayerSource
from ..model.llama import embedding_rows, rope_tables, window_masks
from ..model.medusa import MedusaConfig, MedusaHeadsModel
from ..model.qlinear import QuantizedLinear, dequantized
from ..recipe.speculative import MedusaTrain

__all__ = [
    "final_hidden",
    "float_teacher",
    "resume",
    "save_checkpoint",
    "train_heads",
    "CHECKPOINT_EVERY",
]

CHECKPOINT_EVERY = 100
_CHECKPOINT = "heads-train.pt"
_FORWARD_BATCH = 8  # windows per layer call while computing the hidden states


@torch.no_grad()
def final_hidden(
    source: LayerSource,
    windows: torch.Tensor,
    layer_input: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """windows [N, T] token ids -> the target's final-norm hidden states [N, T, H].

    `layer_input(i, x)`, when given, sees the residual stream entering layer i (x [N, T, H],
    overwritten once the layer has run: copy what is kept) before each layer runs."""
    cfg = source.cfg
    table = source.embedding()
    x = embedding_rows(cfg, table, windows)  # [N, T, H]
    del table
    t = windows.shape[1]
    positions = torch.arange(t)[None]  # [1, T]
    ropes = rope_tables(cfg, positions, seq_len=t)  # a layer's cos, sin [1, T, D/2]
    masks = window_masks(positions, positions, cfg)  # [1, 1, T, T] per layer window
    for i in range(cfg.num_layers):
        if layer_input is not None:
            layer_input(i, x)
        layer = source.layer(i)
        with dequantized(layer):  # once per layer, not per batch
            for b in range(0, len(x), _FORWARD_BATCH):
                x[b : b + _FORWARD_BATCH] = layer(
                    x[b : b + _FORWARD_BATCH], *ropes[layer.rope], masks[layer.window]
                )[0]
        del layer
    return source.final_norm()(x)


def train_heads(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    spec: MedusaTrain,
    work_dir: Path,
) -> tuple[MedusaHeadsModel, dict[str, Any]]:
    """Train `spec.num_heads` heads on hidden [N, T, H] with the target's `lm_head` as the
    teacher; returns the heads and a report (losses, agreement with the teacher)."""
    n, t, h = hidden.shape
    lm_head = float_teacher(lm_head)
    cfg = MedusaConfig(spec.num_heads, spec.num_layers, h, lm_head.out_features, bias=True)
    heads = MedusaHeadsModel.from_lm_head(cfg, lm_head.weight)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=spec.learning_rate)
    sampler = torch.Generator().manual_seed(spec.seed)
    # Positions t with a teacher for every head: the last head looks num_heads positions on.
    last = t - spec.num_heads - 1
    if last < 1:
        raise ValueError(
            f"calibration.seq_len {t} is too short for {spec.num_heads} Medusa heads "
            f"(needs more than {spec.num_heads + 1} tokens per window)"
        )
    held_out = max(1, n // 10)  # the last windows score the heads, never train them
    train_windows = max(1, n - held_out)
    step, losses = resume(work_dir, heads, optimizer, sampler)
    started = time.perf_counter()
    heads.train()
    while step < spec.steps:
        rows = torch.randint(train_windows, (spec.batch_size,), generator=sampler)
        cols = torch.randint(last, (spec.batch_size,), generator=sampler)
        loss = _distillation_loss(heads, lm_head, hidden, rows, cols)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % CHECKPOINT_EVERY == 0 and step < spec.steps:
            save_checkpoint(work_dir, heads, optimizer, sampler, step, losses)
    heads.eval()
    report = {
        "steps": spec.steps,
        "seconds": time.perf_counter() - started,  # this run's (a resumed run: since resuming)
        "windows": {"train": train_windows, "held_out": n - train_windows},
        "loss_first": float(np.mean(losses[:10])),
        "loss_last": float(np.mean(losses[-10:])),
        "loss_curve": [float(np.mean(losses[i : i + 50])) for i in range(0, len(losses), 50)],
        # Share of held-out positions where head h's greedy token is the target's: about the
        # acceptance of draft position h when every earlier draft was accepted.
        "held_out_agreement": _agreement(heads, lm_head, hidden[train_windows:], spec.num_heads),
    }
    return heads, report


def float_teacher(lm_head: nn.Module) -> nn.Linear:
    """The target's lm_head as a float Linear (a quantized one dequantized once), frozen."""
    if isinstance(lm_head, QuantizedLinear):
        if lm_head.input_quant is not None:
            raise ValueError(
                "speculative.heads.train: the target's lm_head quantizes its inputs (W8A8 / "
                "FP8); the draft's training starts from a weight-only lm_head: leave lm_head "
                "out of those entries"
            )
        with torch.device("meta"):
            linear = nn.Linear(lm_head.in_features, lm_head.out_features, bias=False)
        linear.weight = nn.Parameter(lm_head.dequantize())
        linear.bias = lm_head.bias
        lm_head = linear
    return lm_head.eval().requires_grad_(False)


def _distillation_loss(
    heads: MedusaHeadsModel,
    lm_head: nn.Module,
    hidden: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
) -> torch.Tensor:
    """Mean over heads and positions of KL(teacher || head)."""
    x = hidden[rows, cols]  # [B, H]
    logits = heads(x)  # [B, K, V]
    total = torch.zeros(())
    for k in range(logits.shape[1]):
        with torch.no_grad():
            teacher = torch.log_softmax(lm_head(hidden[rows, cols + k + 1]), dim=-1)  # [B, V]
        student = torch.log_softmax(logits[:, k], dim=-1)  # [B, V]
        total = total + nn.functional.kl_div(
            student, teacher, log_target=True, reduction="batchmean"
        )
    return total / logits.shape[1]


@torch.no_grad()
def _agreement(
    heads: MedusaHeadsModel, lm_head: nn.Module, hidden: torch.Tensor, num_heads: int
) -> list[float]:
    """Per head, the share of positions whose greedy token equals the target's greedy token
    there (hidden [n, T, H])."""
    t = hidden.shape[1]
    x = hidden[:, : t - num_heads - 1].reshape(-1, hidden.shape[-1])  # [n*P, H]
    proposed = heads(x).argmax(-1)  # [n*P, K]
    shares = []
    for k in range(num_heads):
        future = hidden[:, k + 1 : t - num_heads + k].reshape(-1, hidden.shape[-1])
        truth = lm_head(future).argmax(-1)  # [n*P]
        shares.append(float((proposed[:, k] == truth).float().mean()))
    return shares


def save_checkpoint(
    work_dir: Path,
    heads: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: torch.Generator,
    step: int,
    losses: list[float],
    name: str = _CHECKPOINT,
) -> None:
    """The training's state (the module's state_dict, AdamW's, the sampler's RNG, the step and
    the losses so far) as work_dir/name, replaced atomically."""
    tmp = work_dir / f"{name}.tmp"
    state = {
        "step": step,
        "heads": heads.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.get_state(),
        "losses": losses,
    }
    torch.save(state, tmp)
    tmp.replace(work_dir / name)  # atomic: a crash leaves the previous checkpoint


def resume(
    work_dir: Path,
    heads: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: torch.Generator,
    name: str = _CHECKPOINT,
) -> tuple[int, list[float]]:
    """(step, losses) of the work directory's checkpoint `name`, loaded into the arguments;
    (0, []) when there is none."""
    file = work_dir / name
    if not file.exists():
        return 0, []
    state = torch.load(file, weights_only=True)
    heads.load_state_dict(state["heads"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_state(state["sampler"])
    return int(state["step"]), list(state["losses"])
