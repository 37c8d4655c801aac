"""Paged decode attention for benchmarks.spike.kernels: one layer, one new token per sequence,
ours reading ingot's pool in place (fp32 and int8 KV) against ONNX Runtime's two graphs from
kernel_ceiling.py (gather the blocks + concat the new token + Attention, and scatter the new
token into the pool + gather + Attention), all on the same pool contents; checked against numpy
before timing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.decode.kernel_ceiling import _attention_sessions
from benchmarks.spike.kernlib import Kernels

BLOCK = 16


@dataclass(frozen=True)
class AttentionCase:
    name: str
    seqs: int
    past: int  # tokens already in the pool; the new one goes at this position
    q_heads: int
    kv_heads: int
    head_dim: int = 64


CASES = (
    AttentionCase("pydoc-16m heads (6 / 2), 32 x 250", 32, 250, 6, 2),
    AttentionCase("1B heads (32 / 8), 32 x 250", 32, 250, 32, 8),
    AttentionCase("1B heads (32 / 8), 1 x 4096", 1, 4096, 32, 8),
)


class AttentionSetup:
    """One case's pools, tables and inputs, ORT's bound sessions and our calls."""

    def __init__(self, case: AttentionCase, kernels: Kernels, threads: int) -> None:
        self.case, self.kernels, self.threads = case, kernels, threads
        c = case
        rng = np.random.default_rng(0)
        per_seq = -(-(c.past + 1) // BLOCK)  # blocks of the past and the new token
        num_blocks = c.seqs * per_seq + 1
        shape = (num_blocks, BLOCK, c.kv_heads, c.head_dim)
        self.pools = {k: rng.standard_normal(shape, dtype=np.float32) for k in "kv"}
        self.ours_pools = {k: v.copy() for k, v in self.pools.items()}  # its own, same values
        self.int8_pools = {k: rng.integers(-127, 128, shape).astype(np.int8) for k in "kv"}
        self.kv_scales = tuple(
            ((rng.random(c.kv_heads) + 0.5) * 3 / 127).astype(np.float32) for _ in "kv"
        )
        self.tables = (1 + np.arange(c.seqs * per_seq, dtype=np.int64)).reshape(c.seqs, per_seq)
        self.context_lens = np.full(c.seqs, c.past, np.int64)
        self.q = rng.standard_normal((c.seqs, c.q_heads * c.head_dim), dtype=np.float32)
        self.new = {
            k: rng.standard_normal((c.seqs, c.kv_heads * c.head_dim), dtype=np.float32)
            for k in "kv"
        }
        self.ort_out = np.empty((c.seqs, 1, c.q_heads * c.head_dim), np.float32)
        self.bindings = self._ort_bindings()

    def _ort_bindings(self) -> dict[str, tuple[ort.InferenceSession, Any]]:
        """kernel_ceiling's two graphs, bound as it binds them (the in-place one's pool outputs
        bound to the pools' own memory)."""
        c, past, tables = self.case, self.case.past, self.tables
        heads = (c.q_heads, c.kv_heads, c.head_dim)
        concat, in_place = _attention_sessions(
            c.seqs, heads, list(self.pools["k"].shape), self.threads
        )
        past_tables = tables[:, : -(-past // BLOCK)].copy()
        concat_mask = np.zeros((c.seqs, 1, 1, past_tables.shape[1] * BLOCK + 1), bool)
        concat_mask[..., :past] = concat_mask[..., -1] = True
        where = [tables[:, past // BLOCK], np.full(c.seqs, past % BLOCK, np.int64)]
        slots = np.stack(where, axis=1)[:, None, :].copy()  # [S, 1, 2]: block, offset
        in_place_mask = np.zeros((c.seqs, 1, 1, tables.shape[1] * BLOCK), bool)
        in_place_mask[..., : past + 1] = True
        feeds = {
            "q": self.q[:, None, :],
            "k_new": self.new["k"][:, None, :],
            "v_new": self.new["v"][:, None, :],
        }
        bindings = {}
        for name, session, table, mask in (
            ("ORT gather + concat", concat, past_tables, concat_mask),
            ("ORT scatter in place + gather", in_place, tables, in_place_mask),
        ):
            binding = session.io_binding()
            for k in "kv":
                pool = self.pools[k]
                binding.bind_ortvalue_input(f"{k}_pool", ort.OrtValue.ortvalue_from_numpy(pool))
                if session is in_place:
                    binding.bind_output(
                        f"{k}_out", "cpu", 0, np.float32, list(pool.shape), pool.ctypes.data
                    )
            for feed, value in {**feeds, "tables": table, "mask": mask}.items():
                binding.bind_cpu_input(feed, np.ascontiguousarray(value))
            if session is in_place:
                binding.bind_cpu_input("slots", slots)
            out = self.ort_out
            binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
            bindings[name] = (session, binding)
        return bindings

    def ours(self, int8: bool, out: np.ndarray | None = None) -> np.ndarray:
        pools = self.int8_pools if int8 else self.ours_pools
        return self.kernels.paged_attention(
            self.q,
            self.new["k"],
            self.new["v"],
            pools["k"],
            pools["v"],
            self.tables,
            self.context_lens,
            self.case.q_heads,
            self.threads,
            kv_scales=self.kv_scales if int8 else None,
            out=out,
        )

    def cases(self) -> dict[str, Callable[[], Any]]:
        out = np.empty((self.case.seqs, self.case.q_heads * self.case.head_dim), np.float32)
        runs: dict[str, Callable[[], Any]] = {
            name: (lambda s=s, b=b: s.run_with_iobinding(b))
            for name, (s, b) in self.bindings.items()
        }
        runs["ours, fp32 KV"] = lambda: self.ours(False, out)
        runs["ours, int8 KV"] = lambda: self.ours(True, out)
        return runs

    def check(self) -> dict[str, Any]:
        """ours (fp32) against ORT's in-place graph and numpy, ours (int8) against numpy: max
        abs difference over the reference's largest |value|."""
        session, binding = self.bindings["ORT scatter in place + gather"]
        session.run_with_iobinding(binding)
        theirs = self.ort_out.reshape(self.case.seqs, -1).copy()
        fp32, int8 = self.ours(False), self.ours(True)
        ref = self._reference(self.ours_pools, None)
        ref8 = self._reference(self.int8_pools, self.kv_scales)
        return {
            "ours_fp32_vs_numpy": _rel(fp32, ref),
            "ort_vs_numpy": _rel(theirs, ref),
            "ours_fp32_vs_ort": _rel(fp32, theirs),
            "ours_int8_vs_numpy": _rel(int8, ref8),
        }

    def _reference(self, pools: dict[str, np.ndarray], scales: tuple | None) -> np.ndarray:
        """numpy over the pools as they are after our call wrote the new token (float64)."""
        c = self.case
        d, group = c.head_dim, c.q_heads // c.kv_heads
        out = np.zeros((c.seqs, c.q_heads * d))
        for s in range(c.seqs):
            k, v = (pools[n][self.tables[s]].reshape(-1, c.kv_heads, d) for n in "kv")
            k, v = k[: c.past + 1].astype(np.float64), v[: c.past + 1].astype(np.float64)
            if scales is not None:
                k, v = k * scales[0][:, None], v * scales[1][:, None]
            for j in range(c.q_heads):
                scores = k[:, j // group] @ self.q[s, j * d : (j + 1) * d] / np.sqrt(d)
                p = np.exp(scores - scores.max())
                out[s, j * d : (j + 1) * d] = p @ v[:, j // group] / p.sum()
        return out


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())
