"""Run an exported graph on an engine through a paged KV pool and compare it with the IR.

The engine is anything that runs the graph's interface (`GraphRunner`, pipeline/engines/base.py:
named inputs in, named outputs out); this module knows no engine. ONNX Runtime's is `OrtGraph`
(pipeline/engines/onnxruntime), whose sessions the numbers below were measured with.

The graph side: two random-token sequences of different lengths in one padded batch, each
prefilled in two uneven chunks through a throwaway pool (block ids scattered by a random
permutation, spare blocks, N(0, 3) garbage in every slot), so the second chunk reads its past
K/V back from the pool. The pool, block tables and masks built here exist only for this check
(the runtime has its own).

The reference is the IR itself, run under the same KV rounding as the graph: with an fp16 pool
the graph casts each call's new K/V to fp16 *before* attending (docs/design.md, "Paged KV
contract"), so every key and value any token attends to has been rounded to the pool's dtype.
The reference rounds its K/V the same way. Rounding alone is not enough, though: where the IR's
fp32 value and the graph's differ by fp32 noise across an fp16 rounding boundary, the two round
to neighbouring fp16 values, and one such 1-ulp step (5e-4 relative) in a stored K or V moves
the logits far more than all the fp32 noise (measured: 20-70x more). So where the graph stored
a value within one fp16 ulp of the reference's rounded value, the reference adopts the graph's
value (the pool holds it: the check reads it back), and reports how many it adopted
(``kv_rounding_ties``). Both sides then attend to the same K/V wherever they agree to storage
precision; a wrong K or V differs by far more than one ulp and is not adopted. With that, the
two sides differ only by fp32 arithmetic (and, with ``accuracy="int8_activations"``, by ORT's
int8 activation quantization), whatever the pool's dtype.

An int8 / fp8 pool (`pipeline/model/kv_quant.py`) is the same story one grid coarser: the IR's
layers round their K/V to the pool's codes themselves (`KVQuant`, the calibrated per-head
scales the graph holds), and where the graph stored a neighbouring code (the two sides rounded
a value lying on a code boundary each its own way: fp32 noise, a 1-step difference), the
reference adopts the graph's code. A wrong K or V differs by many steps and is not adopted.
The reference's layers must round as the graph's pool does (same dtype), else the check fails
naming both.

The reference is computed layer-major: `LayerSource.layer(i)` is asked for once per layer, every
sequence runs its two chunks through that layer (keeping only that layer's own K/V cache), and
the layer is let go before the next is asked for. The check therefore costs one decoder layer
of memory (plus the embedding table and lm_head, one at a time, at the ends) and activations of
a few dozen tokens, whatever the model's size. It reuses the IR's own modules
(`DecoderLayer.forward`, `rope.cos_sin`, `llama.causal_mask`): there is no second attention.

Pass criterion, with ``tol = rtol * max|IR logits|``: max|graph - IR| over the logits <= tol,
the same for ``hidden`` against its own scale, and the argmax equal at every position except
near-ties (the IR's top-2 margin <= tol), which are exempt and counted. NaN fails.

The default ``rtol`` (`RTOL`) is set from the largest relative error (logits or hidden, over
float and int4 weights, 2 seeds) measured on random models: tests/fixtures `make_checkpoint`
(weights N(0, 0.15)) with RTN int4 g32 symmetric (lm_head float), vocab 320..8000, block size
8, this check's 24 + 16 tokens, ORT 1.32 CPU; and a Llama-3.2-1B-shaped checkpoint (2048 x 16
layers, 32/8 heads, vocab 128256, llama3 RoPE, random bf16 N(0, 0.02) weights):

    hidden x layers | exact,   | exact, fp16 KV                         | int8 activations
                    | fp32 KV  | this check | rounding only | old check | (int4, fp32/fp16 KV)
    64 x 2          | 8.8e-7   | 9.1e-7     | 1.7e-5        | 9.5e-4    | 5.0e-2
    128 x 4         | 2.7e-6   | 1.9e-6     | 1.2e-4        | 1.8e-3    | 9.6e-2
    256 x 3         | 4.5e-6   | 4.0e-6     | 2.7e-4        | 2.3e-3    | 7.8e-2
    512 x 4         | 1.1e-5   | 8.8e-6     | 5.0e-4        | 3.8e-3    | 1.4e-1
    1024 x 3        | 1.7e-5   | 1.3e-5     | 4.5e-4        | 4.5e-3    | 1.5e-1
    1B shape        | 3.4e-6   | 5.4e-6     | 2.2e-4        | 8.7e-4    | 4.6e-2

("rounding only": the reference rounds its K/V but adopts no ties; "old check": the IR's
unrounded full-sequence forward, as the check was before, whose absolute difference reached
4.0e-3 on the 1B shape, 0.1 at 1024 wide.) Wrong graphs measure 0.27 (one layer's query heads
swapped) to 1.2 (a key RoPE dropped, unrotated keys stored in the pool). So "exact" is 2e-4,
~10x the largest correct error and >1000x below the smallest wrong one, for fp32 and fp16 KV
alike. Int8 activations move random models' outputs by up to 15% of their scale, as much as
some wrong graphs do: no bound separates the two by 10x. "int8_activations" is 0.5 (~3x the
worst, random N(0, 0.15) weights 1024 wide; ~10x the 1B shape): it catches gross errors (a
dropped key RoPE, unrotated keys in the pool, NaN); subtle ones need an "exact" check of the
same graph (a session at accuracy level 0).

Linears that quantize their own inputs (W8A8, FP8: `model/input_quant.py`) are computed by the
graph with the IR's very operations, exactly for the same input; but where fp32 noise upstream
(attention, norms) moves an activation across a rounding boundary the two sides pick
neighbouring codes, and one code step of an int8 / FP8 activation is far coarser than fp32
noise. Measured on the demo model (pydoc-tiny; the w8a8, fp8 and mixed recipes): up to 4.0e-3
(logits or hidden); random fixtures stay below 1e-6 (their activations seldom land on a
boundary in 40 tokens). FP8 inputs have 3 mantissa bits, so one flipped code moves a value by
up to 1/16 of itself: 0.033 (hidden) measured on pydoc-16m with per-token FP8. Where the IR has
such linears the tolerance is therefore at least `QUANTIZED_INPUTS_RTOL` of the dtype: int8
0.03 (~8x the worst measured, ~9x below the smallest wrong graph), fp8 0.1 (3x the worst
measured, 2.7x below the smallest wrong graph: a looser check); the report says which
(``quantized_inputs``: the dtypes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from ..engines.base import Accuracy, GraphRunner
from ..model.kv_rounding import KVQuant, dequantize_kv, quantize_kv
from ..model.layer_source import LayerSource
from ..model.llama import causal_mask
from ..model.qlinear import dequantized
from ..model.rope import cos_sin
from .errors import ExportError

__all__ = ["check_graph", "GraphCheck", "GraphRunner", "RTOL", "Accuracy"]

# Relative tolerances, max|graph - IR| / max|IR|, from measurements (module docstring): fp32
# activations, fp32 or fp16 KV: largest 1.7e-5 -> 2e-4; int8 activations: largest 0.15 -> 0.5.
RTOL: dict[str, float] = {"exact": 2e-4, "int8_activations": 0.5}
# At least this where the IR quantizes linears' inputs, by input dtype (module docstring).
QUANTIZED_INPUTS_RTOL: dict[str, float] = {"int8": 0.03, "fp8": 0.1}

# pool input dtype -> (numpy dtype of the pool, kv_cache.dtype); an fp8 pool is E4M3FN bytes
_KV_TYPES = {
    "float32": (np.float32, "fp32"),
    "float16": (np.float16, "fp16"),
    "int8": (np.int8, "int8"),
    "uint8": (np.uint8, "fp8"),
}
_KV_NAMES = {np.dtype(dtype): name for dtype, name in _KV_TYPES.values()}


def check_graph(
    source: LayerSource,
    runner: GraphRunner,
    *,
    num_tokens: int = 24,
    seed: int = 0,
    rtol: float | None = None,
    accuracy: Accuracy = "exact",
    rope_len: int | None = None,
) -> dict[str, Any]:
    """Compare the graph ``runner`` runs with the IR (``rope_len``: `GraphCheck`).

    ``accuracy`` says how the runner computes: "exact" (fp32 activations everywhere) or
    "int8_activations" (ORT: MatMulNBits at accuracy level 4); it picks the default ``rtol``
    (`RTOL`). Raises ``ExportError`` on a mismatch (see the module docstring for the
    criterion); returns the report that becomes ``check.json``.
    """
    return GraphCheck(source, num_tokens=num_tokens, seed=seed, rope_len=rope_len)(
        runner, rtol=rtol, accuracy=accuracy
    )


@dataclass(frozen=True)
class _Reference:
    """The IR's side of a check (`_reference`): logits [n, V] and hidden [n, hidden] per
    prompt, the rounding ties it adopted, the dtypes its linears quantize their inputs to."""

    logits: list[np.ndarray]
    hidden: list[np.ndarray]
    ties: int
    quantized_inputs: frozenset[str]
    kv_name: str


class GraphCheck:
    """`check_graph` for several runners of one graph against one IR (the exact variant of an
    engine that is not exact, then the engine itself): the IR's reference, the costly half of
    a check (every layer read, dequantized and run twice per chunk), is computed once, by the
    first call, and reused by the later ones.

    The first call's runner settles the rounding ties the reference adopts (module
    docstring), so check the exact runner first: a later runner is compared with a
    reference that took the first one's tie values, which differ from its own by at most one
    step of the pool's grid. That is far inside the int8-activation tolerance a later check
    uses; a later exact check of a different graph could see those steps (the reference
    reports the first call's ``kv_rounding_ties``).
    """

    def __init__(
        self,
        source: LayerSource,
        *,
        num_tokens: int = 24,
        seed: int = 0,
        rope_len: int | None = None,
    ) -> None:
        """``rope_len``: the sequence length the graph's RoPE table was made for
        (`rope.table`: the export's max_seq_len), which the reference rotates with too; None:
        each chunk's own length, as transformers. They differ only for LongRoPE past its
        original context."""
        if num_tokens < 4:
            raise ValueError("check_graph needs num_tokens >= 4 (two sequences, two chunks each)")
        self.source, self.num_tokens, self.seed = source, num_tokens, seed
        self.rope_len = rope_len
        self._reference: _Reference | None = None

    def __call__(
        self, runner: GraphRunner, *, rtol: float | None = None, accuracy: Accuracy = "exact"
    ) -> dict[str, Any]:
        """Check ``runner`` (see `check_graph`)."""
        if accuracy not in RTOL:
            raise ValueError(f"accuracy: {accuracy!r} (allowed: {', '.join(RTOL)})")
        if accuracy == "exact" and runner.accuracy == "int8_activations":
            # Held to the exact tolerance it would fail spuriously.
            raise ValueError(
                "the engine computes with int8 activations: check it with "
                'accuracy="int8_activations"'
            )
        run = _run_graph(runner, self.source.cfg, self.num_tokens, self.seed)
        ref = self._reference
        if ref is None:
            logits, hidden, ties, quantized = _reference(
                self.source, run.prompts, run.splits, run.kv_dtype, run.cache.stored, self.rope_len
            )
            ref = _Reference(logits, hidden, ties, frozenset(quantized), run.kv_name)
            self._reference = ref
        elif ref.kv_name != run.kv_name:
            raise ExportError(
                f"the graph's KV pool is {run.kv_name} but the reference was computed for a "
                f"{ref.kv_name} pool: check each graph with a GraphCheck of its own"
            )
        if rtol is None:
            rtol = RTOL[accuracy]
            rtol = max([rtol] + [QUANTIZED_INPUTS_RTOL[d] for d in ref.quantized_inputs])

        report = _compare(run.logits, run.hidden, ref.logits, ref.hidden, rtol)
        report["kv_dtype"] = run.kv_name
        report["kv_rounding_ties"] = ref.ties
        report["accuracy"] = accuracy
        report["quantized_inputs"] = sorted(ref.quantized_inputs)
        ok = (
            report["max_rel_logit_diff"] <= rtol  # `<=` is False for NaN
            and report["max_rel_hidden_diff"] <= rtol
            and report["greedy_match"]
        )
        if not ok:
            raise ExportError(f"exported graph disagrees with the IR: {report}")
        return report


def _compare(
    got_logits: list[np.ndarray],
    got_hidden: list[np.ndarray],
    ref_logits: list[np.ndarray],
    ref_hidden: list[np.ndarray],
    rtol: float,
) -> dict[str, Any]:
    """The report of the graph's outputs against the reference's, one [n, ·] array per
    sequence each. Relative differences are over the largest |reference| value of all
    sequences (the scale of the logits, of ``hidden``)."""
    pairs = list(zip(got_logits, ref_logits, strict=True))
    abs_logit = max(float(np.abs(g - r).max()) for g, r in pairs)
    abs_hidden = max(
        float(np.abs(g - r).max()) for g, r in zip(got_hidden, ref_hidden, strict=True)
    )
    logit_scale = max(float(np.abs(r).max()) for r in ref_logits)
    hidden_scale = max(float(np.abs(r).max()) for r in ref_hidden)
    tol = rtol * logit_scale
    mismatches = near_ties = 0
    for g, r in pairs:
        top2 = np.sort(r, axis=-1)[:, -2:]  # [n, 2]
        tie = top2[:, 1] - top2[:, 0] <= tol
        near_ties += int(tie.sum())
        mismatches += int(((g.argmax(-1) != r.argmax(-1)) & ~tie).sum())
    return {
        "max_abs_logit_diff": abs_logit,
        "max_abs_hidden_diff": abs_hidden,
        "max_rel_logit_diff": _ratio(abs_logit, logit_scale),
        "max_rel_hidden_diff": _ratio(abs_hidden, hidden_scale),
        "rtol": rtol,
        "greedy_match": mismatches == 0,
        "near_ties_exempt": near_ties,
        "tokens_checked": sum(len(r) for r in ref_logits),
    }


def _ratio(diff: float, scale: float) -> float:
    if diff == 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(diff) / np.float64(scale))  # NaN stays NaN, x / 0 is inf


# --- the reference: the IR, one layer at a time ---------------------------------------------


# (layer, sequence, start, end) -> the graph's stored K, V for those positions: [T, Hkv, D] each
StoredKV = Callable[[int, int, int, int], tuple[np.ndarray, np.ndarray]]


@torch.no_grad()
def _reference(
    source: LayerSource,
    prompts: list[np.ndarray],
    splits: list[int],
    kv_dtype: type = np.float32,
    stored: StoredKV | None = None,
    rope_len: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], int, set[str]]:
    """The IR's logits [n, V] and hidden [n, hidden] for each prompt, prefilled in two chunks
    (``prompts[s][:splits[s]]`` then the rest) with K/V rounded to ``kv_dtype`` (the pool's
    numpy dtype; uint8: fp8 codes) as the pool stores them, adopting the graph's ``stored``
    values at rounding ties; the number of ties adopted; the dtypes linears quantize their
    inputs to. Layer-major: holds one decoder layer at a time."""
    cfg = source.cfg
    table = source.embedding()
    xs = [table[torch.from_numpy(np.asarray(p, dtype=np.int64))][None] for p in prompts]
    del table
    kv_name = _KV_NAMES[np.dtype(kv_dtype)]
    fp16 = kv_name == "fp16"
    ties, quantized_inputs = 0, set()
    for i in range(cfg.num_layers):
        layer = source.layer(i)
        quantized_inputs |= _input_dtypes(layer)
        _same_rounding(layer.attn.kv_quant, kv_name, i)
        rounded = fp16 or layer.attn.kv_quant is not None
        with dequantized(layer):  # once per layer, not per chunk: bit-identical, faster
            for s, split in enumerate(splits):
                graph_kv = None if stored is None or not rounded else partial(stored, i, s)
                xs[s], n = _layer_chunks(layer, cfg, xs[s], split, fp16, graph_kv, rope_len)
                ties += n
        del layer  # let it go before the next one is loaded
    norm = source.final_norm()
    hidden = [norm(x) for x in xs]
    del norm, xs
    head = source.lm_head()
    quantized_inputs |= _input_dtypes(head)
    logits = [head(h)[0].float().numpy() for h in hidden]
    return logits, [h[0].float().numpy() for h in hidden], ties, quantized_inputs


def _input_dtypes(module: torch.nn.Module) -> set[str]:
    """The dtypes the linears under ``module`` quantize their inputs to (W8A8, FP8)."""
    schemes = (getattr(m, "input_quant", None) for m in module.modules())
    return {s.dtype for s in schemes if s is not None}


def _same_rounding(quant: KVQuant | None, kv_name: str, i: int) -> None:
    """The IR's layer ``i`` must round its K/V as the graph's pool stores them."""
    ir = "fp32 (no rounding)" if quant is None else quant.dtype
    if (quant is None and kv_name in ("fp32", "fp16")) or (quant and quant.dtype == kv_name):
        return
    raise ExportError(
        f"the graph's KV pool is {kv_name} but the IR's layer {i} rounds its K/V as {ir}: "
        "check the graph against the IR with the same kv_cache.dtype and K/V scales"
    )


def _layer_chunks(
    layer: torch.nn.Module,
    cfg: Any,
    x: torch.Tensor,
    split: int,
    fp16: bool,
    graph_kv: Callable[[int, int], tuple[np.ndarray, np.ndarray]] | None,
    rope_len: int | None = None,
) -> tuple[torch.Tensor, int]:
    """x [1, n, hidden] through one decoder layer in chunks [0, split) and [split, n); returns
    the output and the number of rounding ties adopted from ``graph_kv(start, end)``.

    Each chunk runs twice. The first run (K/V only: `DecoderLayer.stored_kv`) yields the
    chunk's K (rotated) and V, which are rounded to fp16 (if ``fp16``; a layer with `KVQuant`
    rounds them to its codes itself) and appended to this layer's cache, exactly as the graph
    rounds them before attending and the pool then holds them. The second run passes that
    cache as ``past`` and masks out the layer's own unrounded copies (appended after ``past``),
    so every query attends to rounded K/V only, its own chunk included.
    """
    cache: tuple[torch.Tensor, torch.Tensor] | None = None  # [1, Hkv, P, D] each, rounded
    outs, ties = [], 0
    for start, end in ((0, split), (split, x.shape[1])):
        chunk = x[:, start:end]
        positions = torch.arange(start, end)[None]  # [1, T]
        cos, sin = cos_sin(cfg, positions, seq_len=rope_len or end)
        k, v = layer.stored_kv(chunk, cos, sin)
        new = (k, v)
        if fp16:
            new = (k.half().float(), v.half().float())
        if graph_kv is not None:
            stored_k, stored_v = graph_kv(start, end)
            quant = layer.attn.kv_quant
            if quant is None:
                (k, n_k), (v, n_v) = _adopt_ties(new[0], stored_k), _adopt_ties(new[1], stored_v)
            else:
                k, n_k = _adopt_code_ties(new[0], stored_k, quant.dtype, quant.k_scale)
                v, n_v = _adopt_code_ties(new[1], stored_v, quant.dtype, quant.v_scale)
            new, ties = (k, v), ties + n_k + n_v
        if cache is not None:
            new = (torch.cat((cache[0], new[0]), dim=2), torch.cat((cache[1], new[1]), dim=2))
        cache = new
        keys = torch.arange(end)[None]  # the cache holds positions 0..end-1
        visible = causal_mask(positions, keys, layer.window)  # [1, 1, T, end]
        # the layer's unrounded copies of the chunk's K/V, [1, 1, T, T]: never attended
        hidden_fresh = torch.zeros_like(visible[..., : end - start])
        out, _ = layer(chunk, cos, sin, torch.cat((visible, hidden_fresh), dim=-1), cache)
        outs.append(out)
    return torch.cat(outs, dim=1), ties


def _adopt_ties(ours: torch.Tensor, stored: np.ndarray) -> tuple[torch.Tensor, int]:
    """ours: [1, Hkv, T, D] fp16 values (in fp32); stored: the graph's [T, Hkv, D] fp16.
    Where the two are one fp16 ulp apart (both sides rounded a value lying near a rounding
    boundary, each its own way), take the graph's; returns the values and how many."""
    mine = ours[0].transpose(0, 1).numpy().astype(np.float16)  # [T, Hkv, D], exact
    graph = np.asarray(stored, dtype=np.float16)
    ulp = np.maximum(np.spacing(np.abs(mine)), np.spacing(np.abs(graph))).astype(np.float32)
    tie = (mine != graph) & (np.abs(mine.astype(np.float32) - graph.astype(np.float32)) <= ulp)
    out = torch.from_numpy(np.where(tie, graph, mine).astype(np.float32))
    return out.transpose(0, 1)[None].contiguous(), int(tie.sum())


def _adopt_code_ties(
    ours: torch.Tensor, stored: np.ndarray, dtype: str, scale: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """ours: [1, Hkv, T, D] values of the IR's codes (in fp32); stored: the graph's codes
    [T, Hkv, D] (int8, or E4M3FN bytes as uint8); scale [Hkv]. Where the two codes are
    neighbours (one step apart on the code grid, same sign), take the graph's; returns the
    values and how many."""
    per_head = scale.view(1, -1, 1, 1)  # [1, Hkv, 1, 1]
    mine = quantize_kv(ours, per_head, dtype)[0].transpose(0, 1)  # [T, Hkv, D] codes
    graph = torch.from_numpy(np.ascontiguousarray(stored))
    if dtype == "fp8":
        # E4M3FN bytes are sign-magnitude: within one sign, neighbouring values are
        # neighbouring byte values.
        graph = graph.view(torch.float8_e4m3fn)
        a, b = mine.view(torch.uint8).to(torch.int16), graph.view(torch.uint8).to(torch.int16)
        tie = ((a - b).abs() == 1) & ((a ^ b) & 0x80 == 0)
    else:
        tie = (mine.to(torch.int16) - graph.to(torch.int16)).abs() == 1
    codes = torch.where(tie, graph, mine)
    values = dequantize_kv(codes, scale.view(1, -1, 1))  # [T, Hkv, D]
    return values.transpose(0, 1)[None].contiguous(), int(tie.sum())


# --- the graph side: a throwaway paged pool ---------------------------------------------------


@dataclass(frozen=True)
class _GraphRun:
    prompts: list[np.ndarray]  # token ids per sequence
    splits: list[int]  # where each sequence's second chunk starts
    logits: list[np.ndarray]  # [n, V] per sequence
    hidden: list[np.ndarray]  # [n, hidden] per sequence
    cache: _PagedCache  # the pool after both chunks: every real token's K/V as stored

    @property
    def kv_dtype(self) -> type:  # the pool's numpy dtype
        return self.cache.kv_dtype

    @property
    def kv_name(self) -> str:  # "fp32" | "fp16" | "int8" | "fp8"
        return self.cache.kv_name


def _run_graph(runner: GraphRunner, cfg: Any, num_tokens: int, seed: int) -> _GraphRun:
    """Two random-token sequences (``num_tokens`` and about 2/3 of it), each prefilled in two
    uneven chunks, batched with padding through a throwaway pool."""
    rng = np.random.default_rng(seed)
    lengths = [num_tokens, num_tokens - num_tokens // 3]  # different lengths -> padded batch
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in lengths]
    splits = [n // 2 + s for s, n in enumerate(lengths)]  # uneven chunks on purpose
    cache = _PagedCache(runner, cfg.num_layers, lengths, rng)
    logits, hidden = cache.prefill(prompts, splits, cfg.sliding_window)
    return _GraphRun(prompts, splits, logits, hidden, cache)


class _PagedCache:
    """A throwaway paged KV pool: per-layer numpy blocks, scattered block tables, slot writes."""

    def __init__(
        self, runner: GraphRunner, num_layers: int, lengths: list[int], rng: np.random.Generator
    ) -> None:
        spec = runner.inputs
        (_, self.block, hkv, d), pool_type = spec["k_pool_0"]
        if pool_type not in _KV_TYPES:
            allowed = ", ".join(_KV_TYPES)
            raise ExportError(f"k_pool_0 has type {pool_type} (expected one of {allowed})")
        self.kv_dtype, self.kv_name = _KV_TYPES[pool_type]
        self.runner, self.num_layers = runner, num_layers
        # A graph with kv_slots writes each call's K/V into the pool itself (its outputs are
        # the written pools); an older one returns them and this cache writes them.
        self.writes_pool = "kv_slots" in spec
        # A model mixing local and global layers: the local layers read tables, slots and a
        # mask of their own; here the same tables and slots, the mask with the window.
        self.local = "block_tables_local" in spec
        per_seq = [-(-n // self.block) for n in lengths]  # ceil
        num_blocks = sum(per_seq) + 3  # spare blocks that no table names
        ids = rng.permutation(num_blocks)  # scattered, non-contiguous block ids
        self.scratch = int(ids[-1])  # a spare block: where padded rows' K/V go
        self.tables = np.zeros((len(lengths), max(per_seq)), dtype=np.int64)
        start = 0
        for s, n in enumerate(per_seq):
            self.tables[s, :n] = ids[start : start + n]
            start += n
        # Garbage (finite) in every slot: anything the mask fails to hide shows up in the logits.
        shape = (num_blocks, self.block, hkv, d)
        self.pools = {
            f"{kind}_pool_{layer}": _garbage(rng, shape, self.kv_dtype, self.kv_name)
            for layer in range(num_layers)
            for kind in "kv"
        }

    def prefill(
        self, prompts: list[np.ndarray], splits: list[int], window: int | None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each prompt in two batched calls (up to its split, then the rest): the graph's
        logits [n, V] and hidden [n, hidden] per prompt."""
        logits: list[list[np.ndarray]] = [[] for _ in prompts]
        hidden: list[list[np.ndarray]] = [[] for _ in prompts]
        lengths = [len(p) for p in prompts]
        for bounds in ([(0, e) for e in splits], list(zip(splits, lengths, strict=True))):
            chunks = [p[a:b] for p, (a, b) in zip(prompts, bounds, strict=True)]
            out = self.step(chunks, [a for a, _ in bounds], window)
            for s, chunk in enumerate(chunks):
                logits[s].append(out["logits"][s, : len(chunk)])
                hidden[s].append(out["hidden"][s, : len(chunk)])
        return [np.concatenate(c) for c in logits], [np.concatenate(c) for c in hidden]

    def stored(self, layer: int, seq: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """What the pool holds for sequence ``seq``'s positions [start, end) in ``layer``:
        K and V, [T, Hkv, D] each, in the pool's dtype."""
        slots = np.arange(start, end)
        blocks, offsets = self.tables[seq, slots // self.block], slots % self.block
        return (
            self.pools[f"k_pool_{layer}"][blocks, offsets],
            self.pools[f"v_pool_{layer}"][blocks, offsets],
        )

    def step(self, chunks: list[np.ndarray], context: list[int], window: int | None) -> dict:
        """Run one batched call for ``chunks`` (sequence s already holds ``context[s]`` tokens)."""
        s_count, q = len(chunks), max(len(c) for c in chunks)
        past = self.tables.shape[1] * self.block
        ids = np.zeros((s_count, q), dtype=np.int64)
        positions = np.zeros((s_count, q), dtype=np.int64)
        # Key slots: the table's, then (a graph that returns its K/V) the call's own tokens.
        width = past if self.writes_pool else past + q
        # by window: the global layers' (None) and the local layers' of a mixed model
        masks = {w: np.zeros((s_count, 1, q, width), dtype=bool) for w in {window, None}}
        kv_slots = np.zeros((s_count, q, 2), dtype=np.int64)
        kv_slots[..., 0] = self.scratch  # padded rows write here
        for s, (chunk, ctx) in enumerate(zip(chunks, context, strict=True)):
            n = len(chunk)
            ids[s, :n], positions[s, :n] = chunk, ctx + np.arange(n)
            if self.writes_pool:  # table slot j is position j, the call's own tokens included
                key_pos, key_ok = np.arange(past), np.arange(past) < ctx + n
                where = positions[s, :n]
                kv_slots[s, :n] = np.stack(
                    [self.tables[s, where // self.block], where % self.block], -1
                )
            else:
                key_pos = np.concatenate([np.arange(past), ctx + np.arange(q)])
                key_ok = np.concatenate([np.arange(past) < ctx, np.arange(q) < n])
            for t in range(n):
                allowed = key_ok & (key_pos <= ctx + t)
                for w, mask in masks.items():
                    mask[s, 0, t] = allowed if w is None else allowed & (ctx + t - key_pos < w)
            # Padding queries attend to one slot only: no all-False row, outputs ignored.
            pad = np.arange(n, q)
            for mask in masks.values():
                mask[s, 0, pad, 0 if self.writes_pool else past + pad] = True
        feed = {
            "input_ids": ids,
            "positions": positions,
            "block_tables": self.tables,
            "context_lens": np.asarray(context, dtype=np.int64),
            "attention_mask": masks[None if self.local else window],
            "logits_indices": np.arange(s_count * q, dtype=np.int64),  # every row
            **({"kv_slots": kv_slots} if self.writes_pool else {}),
            **(
                {
                    "block_tables_local": self.tables,
                    "attention_mask_local": masks[window],
                    "kv_slots_local": kv_slots,
                }
                if self.local
                else {}
            ),
            **self.pools,
        }
        out = self.runner.run(feed)
        for key in ("logits", "hidden"):  # [S*Q, X] -> [S, Q, X]
            out[key] = out[key].reshape(s_count, q, -1)
        if self.writes_pool:  # unbound, the outputs are fresh copies of the written pools
            for name in self.pools:
                self.pools[name] = out[name.replace("_pool_", "_pool_out_")]
            return out
        hkv, d = self.pools["k_pool_0"].shape[2:]
        for key in [n for n in out if n.startswith("new_")]:  # [S, Q, Hkv*D] -> [..., Hkv, D]
            out[key] = out[key].reshape(s_count, q, hkv, d)
        for s, (chunk, ctx) in enumerate(zip(chunks, context, strict=True)):
            slots = ctx + np.arange(len(chunk))
            blocks, offsets = self.tables[s, slots // self.block], slots % self.block
            for layer in range(self.num_layers):
                for kind in "kv":
                    new = out[f"new_{kind}_{layer}"][s, : len(chunk)]  # [n, Hkv, D]
                    self.pools[f"{kind}_pool_{layer}"][blocks, offsets] = new
        return out


def _garbage(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: type, kv_name: str
) -> np.ndarray:
    """Finite garbage for every slot of a pool of ``kv_name``: N(0, 3) values, or random
    codes (fp8: any E4M3FN byte but the two NaNs, 0x7F and 0xFF)."""
    if kv_name == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    if kv_name == "fp8":
        magnitude = rng.integers(0, 0x7F, shape)  # 0x00 .. 0x7E: 0 .. 448
        return (magnitude | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)
    return rng.normal(0, 3, shape).astype(dtype)
