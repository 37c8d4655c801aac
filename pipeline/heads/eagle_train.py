"""Self-distillation of an EAGLE-3 draft against the quantized target (speculative.heads.train
of method eagle).

The target is the quantize stage's IR, as for Medusa (`train.py`): one walk over its layers
(one decoder layer in memory) keeps, for every calibration window, the three aux states (the
residual streams entering layers `aux_layers`: the draft's features, [N, T, 3 Ht]) and the
final-norm hidden states ([N, T, Ht]: the teacher's input).

Each step draws `batch_size` spans of `span` tokens and unrolls `ttt_steps` drafting steps
over them (EAGLE-3's training-time test). Row p of step 0 reads (tok[p+1], fc(f_p)); row p of
step j >= 1 reads (tok[p+1], the prenorm of step j-1 at row p-1), as chained drafting does
(the draft at position n-1+j continues from position n-2+j's output), and attends to what the
runtime's draft cache then holds: step 0's keys at positions <= p-j and step i's key at
position p-j+i (1 <= i <= j). Every row learns KL(p_target(p+1) || q(p)), the target's own
distribution of tok[p+2] (its lm_head over final[p+1], on the fly: never a [windows x T x V]
tensor), step j's rows (only those p >= j, whose inputs exist) weighted 0.8 ** j.

Resumable like the Medusa heads' training: every `CHECKPOINT_EVERY` steps the draft, AdamW's
state, the step and the span sampler's RNG go to the work directory; a resumed build ends
with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.eagle3 import Eagle3Draft
from ..model.layer_source import LayerSource
from ..model.rope import cos_sin
from ..recipe.speculative import EagleTrain
from .train import CHECKPOINT_EVERY, final_hidden, float_teacher, resume, save_checkpoint

__all__ = ["draft_acceptance", "target_features", "train_eagle", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "eagle-train.pt"
_DECAY = 0.8  # EAGLE-3's weight of drafting step j's loss: 0.8 ** j
_EVAL_CHAINS = 256  # about how many held-out chains score the draft (at least one window's)


@torch.no_grad()
def target_features(
    source: LayerSource, windows: torch.Tensor, aux_layers: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """windows [N, T] -> the draft's features [N, T, 3 Ht] (the residual streams entering
    layers `aux_layers`, concatenated in that order) and the final-norm states [N, T, Ht]."""
    cfg = source.cfg
    outside = [i for i in aux_layers if not 0 <= i < cfg.num_layers]
    if outside:
        raise ValueError(
            f"speculative.heads.train.aux_layers {list(aux_layers)}: {outside} not in "
            f"[0, {cfg.num_layers - 1}] (the target's layers)"
        )
    n, t = windows.shape
    h = cfg.hidden_size
    features = torch.empty(n, t, len(aux_layers) * h)

    def keep(i: int, x: torch.Tensor) -> None:
        for k, layer in enumerate(aux_layers):
            if layer == i:
                features[..., k * h : (k + 1) * h] = x

    return features, final_hidden(source, windows, keep)


def train_eagle(
    features: torch.Tensor,
    final: torch.Tensor,
    windows: torch.Tensor,
    lm_head: nn.Module,
    embedding: torch.Tensor,
    target_cfg: ModelConfig,
    aux_layers: tuple[int, int, int],
    spec: EagleTrain,
    work_dir: Path,
) -> tuple[Eagle3Draft, dict[str, Any]]:
    """Train a draft (`Eagle3Draft.for_target`) on the windows [N, T] with their features
    [N, T, 3 Ht] and final-norm states [N, T, Ht] (`target_features`), the target's `lm_head`
    as the teacher and its `embedding` [V, Ht] shared (frozen); returns the draft and a report
    (losses, acceptance on the held-out windows)."""
    n, t = windows.shape
    span, k = spec.span, spec.ttt_steps
    if span > t:
        raise ValueError(
            f"speculative.heads.train.span {span} exceeds calibration.seq_len {t} (a span lies "
            "inside one window)"
        )
    if span <= k:
        raise ValueError(
            f"speculative.heads.train.span {span} leaves no position for ttt_steps {k} "
            f"(needs more than {k} tokens)"
        )
    if n < 2:
        raise ValueError(
            f"calibration.samples: {n} window leaves none to train the draft on beside the "
            "held-out one"
        )
    held_out = max(1, n // 10)  # the last windows score the draft, never train it
    train_windows = n - held_out
    teacher = float_teacher(lm_head)
    draft = Eagle3Draft.for_target(target_cfg, aux_layers, teacher.weight, embedding, spec.seed)
    # The shared embedding is a buffer, not a parameter: AdamW leaves it as it is.
    optimizer = torch.optim.AdamW(draft.parameters(), lr=spec.learning_rate)
    sampler = torch.Generator().manual_seed(spec.seed)
    step, losses = resume(work_dir, draft, optimizer, sampler, CHECKPOINT_NAME)
    started = time.perf_counter()
    draft.train()
    while step < spec.steps:
        rows = torch.randint(train_windows, (spec.batch_size,), generator=sampler)
        starts = torch.randint(t - span + 1, (spec.batch_size,), generator=sampler)
        idx = starts[:, None] + torch.arange(span)  # [B, S]
        loss = _ttt_loss(
            draft,
            teacher,
            features[rows[:, None], idx[:, :-1]],  # [B, R, 3Ht]: f_p, R = S - 1 rows
            final[rows[:, None], idx[:, 1:]],  # [B, R, Ht]: the target at p + 1
            windows[rows[:, None], idx[:, 1:]],  # [B, R]: tok[p + 1]
            idx[:, :-1],  # [B, R]: p
            k,
            t,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % CHECKPOINT_EVERY == 0 and step < spec.steps:
            save_checkpoint(work_dir, draft, optimizer, sampler, step, losses, CHECKPOINT_NAME)
    draft.eval()
    held = slice(train_windows, n)
    acceptance = draft_acceptance(
        draft, teacher, features[held], final[held], windows[held], k, span
    )
    report = {
        "steps": spec.steps,
        "seconds": time.perf_counter() - started,  # this run's (a resumed run: since resuming)
        "windows": {"train": train_windows, "held_out": held_out},
        "loss_first": float(np.mean(losses[:10])),
        "loss_last": float(np.mean(losses[-10:])),
        "loss_curve": [float(np.mean(losses[i : i + 50])) for i in range(0, len(losses), 50)],
        "held_out_acceptance": acceptance,
        "mean_accepted_length": 1.0 + sum(acceptance),
    }
    return draft, report


@torch.no_grad()
def draft_acceptance(
    draft: Eagle3Draft,
    lm_head: nn.Module,
    features: torch.Tensor,
    final: torch.Tensor,
    windows: torch.Tensor,
    steps: int,
    span: int,
) -> list[float]:
    """Per draft position i (1..steps), the share of chains whose drafts 1..i all equal the
    target's greedy tokens there: greedy verification's acceptance, exact where the text is
    the target's own greedy continuation (elsewhere the target's tokens after a draft are read
    from the text's states, not recomputed).

    A chain starts at every position p of the windows' first `span` tokens (a few windows:
    about `_EVAL_CHAINS` chains) and runs as the runtime does: step 0 from the true features
    and tok[p+1], each later step from the previous step's prenorm and greedy token."""
    n, t = windows.shape
    r = min(span, t) - 1  # rows: positions 0..r-1, each with the target at p + 1
    chains = r - steps + 1  # chain starts whose `steps` drafts stay inside the rows
    if chains < 1:
        raise ValueError(f"{r + 1} tokens per window leave no chain of {steps} drafts")
    count = min(n, -(-_EVAL_CHAINS // chains))
    truth = lm_head(final[:count, 1 : r + 1]).argmax(-1)  # [c, R]: the target's token after p+1
    logits = _unroll(
        draft,
        draft.combine(features[:count, :r]),  # [c, R, H]
        windows[:count, 1 : r + 1],  # [c, R]: tok[p + 1]
        torch.arange(r).expand(count, r),
        steps,
        t,
        greedy=True,
    )
    accepted = torch.ones(count, chains, dtype=torch.bool)
    shares = []
    for i, step_logits in enumerate(logits):
        # Draft i + 1 of the chain from row s sits at row s + i.
        proposed = draft.to_target_ids(step_logits.argmax(-1))[:, i : i + chains]  # [c, C]
        accepted &= proposed == truth[:, i : i + chains]
        shares.append(float(accepted.float().mean()))
    return shares


def _ttt_loss(
    draft: Eagle3Draft,
    teacher: nn.Module,
    features: torch.Tensor,
    final: torch.Tensor,
    ids: torch.Tensor,
    positions: torch.Tensor,
    steps: int,
    seq_len: int,
) -> torch.Tensor:
    """sum over steps j of 0.8 ** j * the mean over rows p >= j of KL(teacher(p+1) || q_j(p))
    (features [B, R, 3Ht], final [B, R, Ht], ids and positions [B, R])."""
    with torch.no_grad():
        target = torch.log_softmax(teacher(final), dim=-1)  # [B, R, V]
    total = torch.zeros(())
    logits = _unroll(draft, draft.combine(features), ids, positions, steps, seq_len)
    for j, step_logits in enumerate(logits):
        student = torch.log_softmax(step_logits, dim=-1)  # [B, R, V]
        kl = nn.functional.kl_div(student, target, log_target=True, reduction="none").sum(-1)
        total = total + _DECAY**j * kl[:, j:].mean()  # rows p < j have no input
    return total


def _unroll(
    draft: Eagle3Draft,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    positions: torch.Tensor,
    steps: int,
    seq_len: int,
    greedy: bool = False,
) -> list[torch.Tensor]:
    """`steps` drafting steps over rows p (hidden [B, R, H], ids and positions [B, R]): the
    logits [B, R, Vd] of each. Step j's row p continues from step j-1's row p-1 (its prenorm;
    with `greedy` its greedy token too, else ids[p] again)."""
    cos, sin = cos_sin(draft.cfg.layer, positions, seq_len=seq_len)  # [B, R, D/2]
    rows = ids.shape[1]
    past = None
    out = []
    for j in range(steps):
        logits, prenorm, past = draft(ids, hidden, cos, sin, _step_mask(rows, j), past)
        out.append(logits)
        hidden = _shift(prenorm)
        if greedy:
            ids = _shift(draft.to_target_ids(logits.argmax(-1)))
    return out


def _step_mask(rows: int, j: int) -> torch.Tensor:
    """[1, 1, R, (j+1) R] bool: row p of step j sees step 0's keys at q <= p - j and step i's
    (1 <= i <= j, in that order after step 0's) at q == p - j + i: the draft cache of chained
    drafting. Each row sees at least itself (step j's key at p)."""
    p = torch.arange(rows)[:, None]  # [R, 1]
    q = torch.arange(rows)[None]  # [1, R]
    blocks = [q <= p - j] + [q == p - j + i for i in range(1, j + 1)]
    return torch.cat(blocks, dim=-1)[None, None]


def _shift(x: torch.Tensor) -> torch.Tensor:
    """x [B, R, ...] moved one row on: row p holds row p-1's (row 0 zeros)."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
