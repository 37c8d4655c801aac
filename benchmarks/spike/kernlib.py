"""The spike's own kernels (spike/kernels/, C++ behind a plain C ABI): built when missing or
older than their sources, loaded with ctypes, wrapped for numpy arrays.

Nothing here is timed; `benchmarks.spike.kernels` times it.
"""

from __future__ import annotations

import ctypes
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.harness.paths import REPO

__all__ = ["Kernels", "Q4Weights", "load"]

SOURCES = REPO / "spike" / "kernels"
LIBRARY = SOURCES / "build" / "libks.so"
GROUP, SUPER, SUPER_BYTES = 32, 512, 288  # q4_layout.h
MADD_KINDS = ("int8", "bf16", "fp32")  # madd_peak.cpp's kinds, in its order

_p, _i64, _int, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "ks_q4_pack": (None, [_p, _p, _i64, _i64, _p]),
    "ks_q8_quantize": (None, [_p, _i64, _i64, _i64, _p, _p, _p]),
    "ks_q4_gemm": (None, [_p, _i64, _i64, _p, _i64, _p, _int]),
    "ks_madd_peak": (ctypes.c_double, [_i64, _int, _int]),
    "ks_paged_attention": (
        _int,
        [_p, _p, _p, _p, _p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _int]
        + [_p, _int],
    ),
}


def build(force: bool = False) -> Path:
    """spike/kernels/build.sh, if the library is missing or older than a source (or `force`)."""
    sources = [*SOURCES.glob("*.cpp"), *SOURCES.glob("*.h"), SOURCES / "build.sh"]
    newest = max(p.stat().st_mtime for p in sources)
    if force or not LIBRARY.exists() or LIBRARY.stat().st_mtime < newest:
        subprocess.run(["sh", str(SOURCES / "build.sh")], check=True)
    return LIBRARY


@dataclass(frozen=True)
class Q4Weights:
    """An int4 g32 symmetric weight [n, k] packed for ks_q4_gemm (q4_layout.h): 288 bytes
    (512 codes, 16 fp16 scales) per row per 512 weights along k."""

    packed: np.ndarray  # [n, k / 512 * 288] uint8
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes


class Kernels:
    """The loaded library, its functions typed, numpy in and out."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = restype, argtypes

    def pack_q4(self, codes: np.ndarray, scales: np.ndarray) -> Q4Weights:
        """MatMulNBits' B codes [n, k/32, 16] uint8 (weight 2t in byte t's low nibble, value
        (code - 8) * scale) and fp16 scales [n, k/32] -> our packed layout."""
        n, groups, _ = codes.shape
        k = groups * GROUP
        if k % SUPER or n % 4:
            raise ValueError(f"k must be a multiple of {SUPER} and n of 4, got k={k}, n={n}")
        codes = np.ascontiguousarray(codes, np.uint8)
        scales = np.ascontiguousarray(scales, np.float16)
        packed = np.empty((n, k // SUPER * SUPER_BYTES), np.uint8)
        self.lib.ks_q4_pack(_ptr(codes), _ptr(scales), n, k, _ptr(packed))
        return Q4Weights(packed, n, k)

    def q4_gemm(
        self, x: np.ndarray, w: Q4Weights, threads: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """x [m, k] float32 @ W.T -> [m, n] float32 (x quantized per group of 32 to int8)."""
        m = x.shape[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or x.shape[1] != w.k:
            raise ValueError(f"x must be C-contiguous float32 [m, {w.k}]")
        y = np.empty((m, w.n), np.float32) if out is None else out
        self.lib.ks_q4_gemm(_ptr(x), m, w.k, _ptr(w.packed), w.n, _ptr(y), threads)
        return y

    def paged_attention(
        self,
        q: np.ndarray,
        k_new: np.ndarray,
        v_new: np.ndarray,
        k_pool: np.ndarray,
        v_pool: np.ndarray,
        tables: np.ndarray,
        context_lens: np.ndarray,
        num_heads: int,
        threads: int,
        kv_scales: tuple[np.ndarray, np.ndarray] | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """One new token per sequence: q [S, Hq*D], k_new / v_new [S, Hkv*D] (K rotated) are
        written into the pools [blocks, B, Hkv, D] (fp32, or int8 with `kv_scales` (k, v)
        [Hkv]) at position context_lens[s] through `tables` [S, MB] int64, then attended over
        positions 0..context_lens[s] in place. Returns [S, Hq*D]."""
        seqs, mb = tables.shape
        _, block, hkv, d = k_pool.shape
        int8 = k_pool.dtype == np.int8
        if int8 != (kv_scales is not None) or k_pool.dtype not in (np.float32, np.int8):
            raise ValueError("fp32 pools without scales, or int8 pools with kv_scales")
        scales = kv_scales or (np.ones(hkv, np.float32), np.ones(hkv, np.float32))
        args = [q, k_new, v_new, k_pool, v_pool, tables, context_lens, *scales]
        for a in args:
            if not a.flags.c_contiguous:
                raise ValueError("every array must be C-contiguous")
        y = np.empty((seqs, num_heads * d), np.float32) if out is None else out
        status = self.lib.ks_paged_attention(
            *map(_ptr, args),
            seqs,
            mb,
            num_heads,
            hkv,
            d,
            block,
            d**-0.5,
            int(int8),
            _ptr(y),
            threads,
        )
        if status != 0:
            raise ValueError(f"shape not supported: heads {num_heads}/{hkv}, head dim {d}")
        return y

    def madd_peak(self, threads: int, kind: str = "int8", iters: int = 20_000_000) -> float:
        """Multiply-adds per second from registers on `threads` threads: `kind` "int8"
        (vpdpbusd), "bf16" (vdpbf16ps) or "fp32" (vfmadd231ps)."""
        code = MADD_KINDS.index(kind)
        return float(self.lib.ks_madd_peak(iters, threads, code))


def load(rebuild: bool = False) -> Kernels:
    return Kernels(build(force=rebuild))


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data
