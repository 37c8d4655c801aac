"""Drafting with an EAGLE-3 draft (speculative.method eagle): one decoder layer that reads the
target's features (the residual streams entering three of its layers, `aux_hidden`) through
`fc`, then its own output, one token per call.

Alignment: the draft row at position p takes (tok[p+1], fc(f_p)) and predicts tok[p+2]. For a
sequence of tokens 0..n (n the last sampled, f_0..f_{n-1} known), call 1 runs the positions
the draft has not computed, start .. n-1, and its last row gives d1 and its prenorm h1; call
j + 1 runs (d_j, h_j) at position n - 1 + j and gives d_{j+1}. The draft's K/V of position p
live in the target's slot for p, in a pool of its own (1 layer, float32, as many blocks as the
target's), addressed by the target's block tables as for a draft model.

Features arrive through `record_features`: after every target call the Generator hands over
the rows of the tokens it keeps (prefill chunks, plain decode steps, verification's kept rows),
and the drafter keeps per sequence those the draft has not computed (`EagleSequence`, the
sequence's SequenceState.drafter_state: the rows of positions `start` on, copies). `propose`
consumes them: afterwards start = n, since only positions < n were computed from true features
(the drafted positions' K/V came from the draft's own hidden rows and are written again by the
next catch-up, from the features verification records).

Rows that do not continue what is pending restart it at their `start`: after a prefix-cache hit
(the target never computed the cached positions, so no features exist), after preemption (which
drops the state: the sequence is recomputed from 0 or from its cached blocks), or when drafting
was off for a while (the Generator records only while a step could draft). Positions before it
are attended as the draft pool holds them: computed by whichever sequence last wrote those
slots, or not at all. Acceptance may drop; the output never changes, since the target verifies
every token. (A sequence preempted before it ever drafted keeps its rows, pending from 0: the
rows recomputing positions still pending replace their tail, the features before them are
still right; `preempted`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort

from ingot.artifacts import safe_relative_path
from ingot.artifacts.manifest import EagleInfo
from ingot.runtime.batch import Batch, build_inputs
from ingot.runtime.engines.onnxruntime.session import EagleLayerSession, open_draft_graph
from ingot.runtime.kv_pool import KVLayout, KVPool
from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative.drafter import Drafter

__all__ = ["EagleDraft", "EagleDrafter", "EagleFc", "EagleSequence", "eagle_kv_layout"]


@dataclass(slots=True)
class EagleSequence:
    """What the draft holds and awaits of one sequence (its SequenceState.drafter_state)."""

    start: int  # the draft took positions < start as computed; rows pend from here
    # Row blocks [m_i, 3Ht] float32 (copies): the target's features of positions start,
    # start + 1, ... in order (kept as blocks, so recording a row does not copy the others).
    rows: list[np.ndarray] = field(default_factory=list)


class EagleFc:
    """draft/eagle/fc.onnx: `features` [N, 3Ht] float32 in, `hidden` [N, H] float32 out."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session  # opened by `open`, which checks its interface

    @classmethod
    def open(cls, path: Path | str) -> EagleFc:
        # One thread, no spinning, as the draft layer's (draft_session_options).
        return cls(open_draft_graph(path, "EAGLE fc graph", "features", "hidden"))

    def run(self, features: np.ndarray) -> np.ndarray:
        """features [N, 3Ht] -> hidden [N, H]."""
        feed = {"features": np.ascontiguousarray(features, dtype=np.float32)}
        return self._session.run(["hidden"], feed)[0]


class _Layer(Protocol):  # EagleLayerSession, or a double in tests
    def run(
        self, batch: Batch, hidden: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]: ...


class _Fc(Protocol):  # EagleFc, or a double in tests
    def run(self, features: np.ndarray) -> np.ndarray: ...


@dataclass(slots=True)
class EagleDraft:
    """The draft layer's session over its own pool, and fc."""

    layer: _Layer
    fc: _Fc
    pool: KVPool

    @classmethod
    def open(cls, root: Path, eagle: EagleInfo, num_blocks: int) -> EagleDraft:
        """The draft's graphs (``eagle.path``, ``eagle.fc_path``, relative to `root`: the
        artifact's draft/eagle/, or the eagle stage's output) on a pool of `num_blocks`
        blocks: the target's, whose block tables address both pools."""
        pool = eagle_kv_layout(eagle).pool(num_blocks)
        layer = EagleLayerSession(safe_relative_path(root, eagle.path), pool)
        return cls(layer, EagleFc.open(safe_relative_path(root, eagle.fc_path)), pool)


def eagle_kv_layout(eagle: EagleInfo) -> KVLayout:
    """The draft layer's pool: one layer, float32 K/V, the target's block size (manifest.py
    checks that ``eagle.kv_block_size`` is the target's)."""
    return KVLayout(1, eagle.kv_block_size, eagle.num_kv_heads, eagle.head_dim, np.float32)


class EagleDrafter(Drafter):
    needs_features = True  # the Generator hands it the target's aux_hidden rows
    windowed = False  # the draft layer attends over every position it holds

    def __init__(self, draft: EagleDraft) -> None:
        self.draft = draft

    def record_features(self, seq: SequenceState, start: int, rows: np.ndarray) -> None:
        """The target's features rows [n, 3Ht] of `seq`'s positions start .. start + n - 1
        (a session buffer: copied)."""
        rows = rows.copy()
        state = seq.drafter_state
        if state is None:
            seq.drafter_state = EagleSequence(start, [rows])
            return
        begin, pending = state.start, state.rows
        held = sum(len(r) for r in pending)
        if begin <= start <= begin + held:
            if start < begin + held:  # recomputed (preempted): these rows replace the tail
                pending[:] = _first_rows(pending, start - begin)
            pending.append(rows)
        else:  # a gap: restart here
            state.start, state.rows = start, [rows]

    def preempted(self, seq: SequenceState) -> None:
        """The draft pool no longer holds any of `seq`'s positions. Rows pending from 0 (it
        never drafted) stay: the recomputation's rows replace their tail. Others go: they
        would restart at the recomputation's first row anyway."""
        state = seq.drafter_state
        if state is not None and state.start:
            seq.drafter_state = None

    def propose(self, seqs: Sequence[SequenceState], ks: Sequence[int]) -> list[list[int]]:
        """Up to ks[i] greedy drafts per sequence whose pending features reach its last token;
        none for the others this step. Each table must hold slots up to position n + k - 2
        (the target reserves n + 1 .. n + k for verification anyway)."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active = [i for i, k in enumerate(ks) if k and _ready(seqs[i])]
        if not active:
            return drafts
        # Call 1: the catch-up rows of every sequence, fc'd in one call.
        features = np.concatenate([r for i in active for r in seqs[i].drafter_state.rows])
        fed = self.draft.fc.run(features)  # [R, H], sequence by sequence
        feeds = []
        for i in active:
            seq, state = seqs[i], seqs[i].drafter_state
            done, n = state.start, len(seq.token_ids) - 1
            feeds.append((seq.table, seq.token_ids[done + 1 : n + 1], done))  # tok[p+1] at p
            state.start, state.rows = n, []  # consumed: the draft holds positions < n now
        batch = build_inputs(feeds)  # the draft layer attends over every position it holds
        s, q = batch.input_ids.shape
        hidden = np.zeros((s * q, fed.shape[-1]), np.float32)
        hidden[slice(None) if batch.real_rows is None else batch.real_rows] = fed
        carry = self._step(batch, hidden.reshape(s, q, -1), active, drafts)  # [A, H]
        # Calls 2..k: (d_j, h_j) at position n - 1 + j -> d_{j+1}.
        for j in range(1, max(ks[i] for i in active)):
            keep = [a for a, i in enumerate(active) if ks[i] > j]
            active, carry = [active[a] for a in keep], carry[keep]
            feeds = []
            for i in active:
                n = len(seqs[i].token_ids) - 1
                feeds.append((seqs[i].table, [drafts[i][-1]], n - 1 + j))
            carry = self._step(build_inputs(feeds), carry[:, None, :], active, drafts)
        return drafts

    def _step(
        self, batch: Batch, hidden: np.ndarray, active: list[int], drafts: list[list[int]]
    ) -> np.ndarray:
        """One draft layer call: its K/V into the pool, each active sequence's token appended
        to its drafts; its draft_hidden rows [A, H] (a copy: the next call's input)."""
        tokens, rows, new_kv = self.draft.layer.run(batch, hidden)
        batch.write_kv(self.draft.pool, new_kv)
        for i, token in zip(active, tokens.tolist(), strict=True):
            drafts[i].append(token)
        return rows.copy()


def _ready(seq: SequenceState) -> bool:
    """Whether `seq`'s pending features are those of positions start .. n - 1."""
    state = seq.drafter_state
    if state is None:
        return False
    n = len(seq.token_ids) - 1
    return state.start < n and state.start + sum(len(r) for r in state.rows) == n


def _first_rows(blocks: list[np.ndarray], count: int) -> list[np.ndarray]:
    """The first `count` rows of row blocks, as row blocks."""
    kept = []
    for block in blocks:
        if count <= 0:
            break
        kept.append(block[:count])
        count -= len(block)
    return kept
