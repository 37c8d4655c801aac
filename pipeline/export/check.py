"""Run an exported graph in ONNX Runtime through a paged KV pool and compare it with the IR.

The pool, block tables and masks built here are deliberately minimal and exist only for this
check (the runtime has its own). They still exercise what matters: two sequences of different
lengths batched with padding, block ids scattered through the pool, garbage in unused slots,
and a prefill split in two chunks so the second chunk reads its past K/V back from the pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model.llama import LlamaModel
from .errors import ExportError

__all__ = ["check_export"]


def check_export(
    model: LlamaModel,
    onnx_path: Path,
    *,
    num_tokens: int = 24,
    seed: int = 0,
    atol: float = 1e-3,
) -> dict[str, Any]:
    """Compare the graph's logits with the IR's full-sequence forward on the same random tokens.

    Raises ``ExportError`` if any logit (or ``hidden`` value) differs by more than ``atol`` or
    any argmax differs. Returns the measured differences and the number of tokens compared.
    """
    import onnxruntime as ort

    if num_tokens < 4:
        raise ValueError("check_export needs num_tokens >= 4 (two sequences, two chunks each)")
    options = ort.SessionOptions()  # default optimizations: ORT's fusions are checked too
    # ORT rewrites DQ+MatMul into MatMulNBits with accuracy_level 4 (int8 activations) by
    # default; that is an engine speed/accuracy choice, not the graph's semantics: pin fp32.
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    cfg = model.cfg
    rng = np.random.default_rng(seed)
    lengths = [num_tokens, num_tokens - num_tokens // 3]  # different lengths -> padded batch
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in lengths]
    with torch.no_grad():
        ref = [model(torch.from_numpy(p)[None]) for p in prompts]
    ref_logits = [r[0][0].numpy() for r in ref]  # [n, V] each
    ref_hidden = [r[1][0].numpy() for r in ref]  # [n, hidden] each

    cache = _PagedCache(session, cfg.num_layers, lengths, rng)
    splits = [n // 2 + s for s, n in enumerate(lengths)]  # uneven chunks on purpose
    logits: list[list[np.ndarray]] = [[] for _ in lengths]
    hidden: list[list[np.ndarray]] = [[] for _ in lengths]
    for bounds in ([(0, e) for e in splits], list(zip(splits, lengths, strict=True))):
        chunks = [p[a:b] for p, (a, b) in zip(prompts, bounds, strict=True)]
        out = cache.step(chunks, [a for a, _ in bounds], cfg.sliding_window)
        for s, chunk in enumerate(chunks):
            logits[s].append(out["logits"][s, : len(chunk)])
            hidden[s].append(out["hidden"][s, : len(chunk)])

    got = [np.concatenate(chunks) for chunks in logits]
    logit_diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref_logits, strict=True))
    hidden_diff = max(
        float(np.abs(np.concatenate(h) - r).max()) for h, r in zip(hidden, ref_hidden, strict=True)
    )
    greedy = all(
        np.array_equal(g.argmax(-1), r.argmax(-1)) for g, r in zip(got, ref_logits, strict=True)
    )
    report = {
        "max_abs_logit_diff": logit_diff,
        "max_abs_hidden_diff": hidden_diff,
        "greedy_match": greedy,
        "tokens_checked": sum(lengths),
    }
    # `not <=` also catches NaN. `hidden` feeds draft heads, so it is held to the same bound.
    if not (logit_diff <= atol and hidden_diff <= atol and greedy):
        raise ExportError(f"{onnx_path}: exported graph disagrees with the IR: {report}")
    return report


class _PagedCache:
    """A throwaway paged KV pool: per-layer numpy blocks, scattered block tables, slot writes."""

    def __init__(
        self, session: Any, num_layers: int, lengths: list[int], rng: np.random.Generator
    ) -> None:
        spec = {i.name: i for i in session.get_inputs()}
        pool = spec["k_pool_0"]
        _, self.block, hkv, d = pool.shape
        dtype = np.float16 if pool.type == "tensor(float16)" else np.float32
        self.session, self.num_layers = session, num_layers
        per_seq = [-(-n // self.block) for n in lengths]  # ceil
        num_blocks = sum(per_seq) + 3  # spare blocks that no table names
        ids = rng.permutation(num_blocks)  # scattered, non-contiguous block ids
        self.tables = np.zeros((len(lengths), max(per_seq)), dtype=np.int64)
        start = 0
        for s, n in enumerate(per_seq):
            self.tables[s, :n] = ids[start : start + n]
            start += n
        # Garbage (finite) in every slot: anything the mask fails to hide shows up in the logits.
        shape = (num_blocks, self.block, hkv, d)
        self.pools = {
            f"{kind}_pool_{layer}": rng.normal(0, 3, shape).astype(dtype)
            for layer in range(num_layers)
            for kind in "kv"
        }

    def step(self, chunks: list[np.ndarray], context: list[int], window: int | None) -> dict:
        """Run one batched call for ``chunks`` (sequence s already holds ``context[s]`` tokens)."""
        s_count, q = len(chunks), max(len(c) for c in chunks)
        past = self.tables.shape[1] * self.block
        ids = np.zeros((s_count, q), dtype=np.int64)
        positions = np.zeros((s_count, q), dtype=np.int64)
        mask = np.zeros((s_count, 1, q, past + q), dtype=bool)  # [S, 1, Q, MB*B + Q]
        for s, (chunk, ctx) in enumerate(zip(chunks, context, strict=True)):
            n = len(chunk)
            ids[s, :n], positions[s, :n] = chunk, ctx + np.arange(n)
            key_pos = np.concatenate([np.arange(past), ctx + np.arange(q)])
            key_ok = np.concatenate([np.arange(past) < ctx, np.arange(q) < n])
            for t in range(n):
                allowed = key_ok & (key_pos <= ctx + t)
                if window is not None:
                    allowed &= ctx + t - key_pos < window
                mask[s, 0, t] = allowed
            # Padding queries attend to themselves only: no all-False row, outputs ignored.
            mask[s, 0, np.arange(n, q), past + np.arange(n, q)] = True
        feed = {
            "input_ids": ids,
            "positions": positions,
            "block_tables": self.tables,
            "context_lens": np.asarray(context, dtype=np.int64),
            "attention_mask": mask,
            **self.pools,
        }
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(names, feed), strict=True))
        for s, (chunk, ctx) in enumerate(zip(chunks, context, strict=True)):
            slots = ctx + np.arange(len(chunk))
            blocks, offsets = self.tables[s, slots // self.block], slots % self.block
            for layer in range(self.num_layers):
                for kind in "kv":
                    new = out[f"new_{kind}_{layer}"][s, : len(chunk)]  # [n, Hkv, D]
                    self.pools[f"{kind}_pool_{layer}"][blocks, offsets] = new
        return out
