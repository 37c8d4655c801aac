"""Kernels of our own (issue 27's spike, route 3): an int4 g32 GEMV / GEMM with AVX-512 VNNI and
a paged decode attention reading ingot's KV pool in place (spike/kernels/, C++ behind a C ABI,
loaded with ctypes), timed beside ONNX Runtime's kernels on the same weights and pools.

Reproduce (about 2 minutes on 2 cores; builds spike/kernels/build/libks.so first if it is
missing or stale; writes benchmarks/results/spike_kernels.json and .md; a run whose host load
exceeded the thread count is refused):

    .venv/bin/python -m benchmarks.spike.kernels [--threads 2]
        [--rounds 15] [--out-dir DIR] [--report-only]

- linears: 4 layers of the Llama-3.2-1B shape's decode linears (q|k|v, o, gate|up, down; as
  kernel_ceiling.py) at M = 1, 4, 8, 32, 128 rows, and the lm_head (128256 x 2048) at M = 1 and 32:
  ours against MatMulNBits accuracy level 4 (int8 activations), ORT's intra-op spinning on
  (its default) and off; the bandwidth bound (a 1 GiB torch sum, kernel_ceiling's) and this
  CPU's vpdpbusd peak measured in the same rounds.
- attention: one layer, one new token per sequence, 32 x 250 (pydoc-16m's heads: kernel_ceiling's
  case; and the 1B shape's) and 1 x 4096 (1B): ours (fp32 and int8 KV) against ORT's gather +
  concat and scatter-in-place + gather graphs.

Every case is checked against numpy before it is timed. Cases run in interleaved rounds (medians),
each after a 0.1 s pause: ORT's intra-op threads spin for more than 10 ms after a run and took
a core from the next case (our 1B step measured 9.4 ms after an ORT run, 4.1 ms otherwise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info, measure_bandwidth
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave, paired
from benchmarks.spike import kern_attention, kern_linears, kernlib
from benchmarks.spike.kernels_report import markdown

STEM = "spike_kernels"
PAUSE_S = 0.1
# A kernel further than this from numpy is wrong, and is not timed (relative to the reference's
# largest |value|; the GEMM is compared on activations rounded as it rounds them).
TOLERANCE = {"gemm": 1e-5, "attention": 1e-4}
STEP_ROWS = (1, 4, 8, 32, 128)  # 128: a prefill chunk
LM_HEAD_ROWS = (1, 32)
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    built = time.perf_counter()
    kernels = kernlib.load()
    report: dict[str, Any] = {
        "benchmark": STEM,
        "machine": machine_info(),
        "isa": _isa_flags(),
        "threads": args.threads,
        "rounds": args.rounds,
        "build_s": round(time.perf_counter() - built, 1),
    }
    report["bandwidth"] = measure_bandwidth(args.threads)
    watch.sample()
    layers = [s for _ in range(4) for s in kern_linears.LINEARS_1B]
    report["linears"] = _linears(kernels, layers, STEP_ROWS, args, watch)
    report["lm_head"] = _linears(kernels, [kern_linears.LM_HEAD], LM_HEAD_ROWS, args, watch)
    report["attention"] = [_attention(case, kernels, args, watch) for case in kern_attention.CASES]
    report["load"] = watch.record()
    report["refused"] = watch.refusal()
    report["duration_s"] = round(time.perf_counter() - started, 1)
    return publish(report, args.out_dir, STEM, markdown)


def _timed(
    cases: dict[str, Callable[[], Any]],
    calls: dict[str, int],
    rounds: int,
    watch: LoadWatch,
    after_round: Callable[[int], Any] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each case, one value per round, the cases interleaved."""
    for run in cases.values():
        run()

    def timed(name: str, _: int) -> float:
        run = cases[name]
        time.sleep(PAUSE_S)  # another runtime's spinning threads leave the cores
        run()
        start = time.perf_counter()
        for _ in range(calls[name]):
            run()
        return (time.perf_counter() - start) / calls[name]

    return interleave(list(cases), rounds, timed, after_case=watch.sample, after_round=after_round)


def _linears(
    kernels: kernlib.Kernels,
    shapes: list[tuple[str, int, int]],
    rows: tuple[int, ...],
    args: argparse.Namespace,
    watch: LoadWatch,
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    lin = kern_linears.make_linears(kernels, shapes)
    sessions = {
        "ORT level 4": kern_linears.ort_session(lin, args.threads, spin=True),
        "ORT level 4, no spinning": kern_linears.ort_session(lin, args.threads, spin=False),
    }
    checks = [
        row
        for m in (1, 32)
        for row in kern_linears.check(lin, kernels, sessions["ORT level 4"], m, args.threads)
    ]
    _refuse_wrong(
        {f"{c['linear']} M={c['m']}": c["ours_vs_q8_x"] for c in checks}, TOLERANCE["gemm"]
    )
    cases: dict[str, Callable[[], Any]] = {}
    calls: dict[str, int] = {}
    for m in rows:
        for name, run in kern_linears.cases(lin, kernels, sessions, m, args.threads).items():
            cases[f"M={m}|{name}"] = run
            calls[f"M={m}|{name}"] = 10 if m == 1 else 1  # 40-70 ms a sample
    big = torch.ones(1 << 28)  # the bound: kernel_ceiling's 1 GiB sum, in the same rounds
    cases["bandwidth"], calls["bandwidth"] = big.sum, 1
    # multiply-add peaks from registers (int8 vpdpbusd, bf16 vdpbf16ps, fp32 FMA) per round
    peaks = {(k, t): [] for k in kernlib.MADD_KINDS for t in (1, args.threads)}

    def peak(_: int) -> None:
        for kind, t in peaks:
            peaks[kind, t].append(kernels.madd_peak(t, kind, 2_000_000))

    times = _timed(cases, calls, args.rounds, watch, after_round=peak)
    bandwidth = [big.numel() * 4 / s for s in times.pop("bandwidth")]
    del big
    best_peak = max(peaks["int8", args.threads])
    result_rows = []
    for m in rows:
        ort_names = [n for n in sessions]
        best_ort = min(ort_names, key=lambda n: statistics.median(times[f"M={m}|{n}"]))
        for name in [*ort_names, "ours"]:
            t = times[f"M={m}|{name}"]
            seconds = statistics.median(t)
            nbytes = lin.our_bytes if name == "ours" else lin.ort_bytes
            # of the bound: each round's rate over that round's bandwidth (the host's drifts by
            # 2x within a run), the median of those
            fractions = [nbytes / ti / b for ti, b in zip(t, bandwidth, strict=True)]
            row = {
                "m": m,
                "case": name,
                "ms": round(seconds * 1e3, 3),
                "weight_gb_per_s": round(nbytes / seconds / 1e9, 2),
                "fraction_of_bound": round(statistics.median(fractions), 3),
                "gmac_per_s": round(m * lin.macs_per_row / seconds / 1e9, 1),
                "fraction_of_vnni_peak": round(m * lin.macs_per_row / seconds / best_peak, 3),
                "ms_rounds": [round(v * 1e3, 3) for v in t],
            }
            if name == "ours":
                ratio = paired(times[f"M={m}|{best_ort}"], t)  # ORT's time / ours: a speedup
                row["speedup_vs_best_ort"] = round(ratio.median, 3)
                row["speedup_rounds"] = [round(r, 3) for r in ratio.rounds]
                row["best_ort"] = best_ort
            result_rows.append(row)
    return {
        "shapes": [list(s) for s in shapes],
        "ort_weight_bytes": lin.ort_bytes,
        "our_weight_bytes": lin.our_bytes,
        "bandwidth_bytes_per_s": statistics.median(bandwidth),
        "bandwidth_rounds": [round(b / 1e9, 2) for b in bandwidth],
        "vnni_peak_macs_per_s": {str(t): max(v) for (k, t), v in peaks.items() if k == "int8"},
        "madd_peaks_macs_per_s": {f"{k}, {t} threads": max(v) for (k, t), v in peaks.items()},
        "check": checks,
        "rows": result_rows,
    }


def _attention(
    case: kern_attention.AttentionCase,
    kernels: kernlib.Kernels,
    args: argparse.Namespace,
    watch: LoadWatch,
) -> dict[str, Any]:
    setup = kern_attention.AttentionSetup(case, kernels, args.threads)
    check = setup.check()
    ours = {k: v for k, v in check.items() if k.startswith("ours")}
    _refuse_wrong({f"{case.name}: {k}": v for k, v in ours.items()}, TOLERANCE["attention"])
    cases = setup.cases()
    times = _timed(cases, dict.fromkeys(cases, 20), args.rounds, watch)
    ort_names = [n for n in cases if n.startswith("ORT")]
    best_ort = min(ort_names, key=lambda n: statistics.median(times[n]))
    rows = []
    for name, t in times.items():
        row = {"case": name, "us": round(statistics.median(t) * 1e6, 1)}
        if not name.startswith("ORT"):
            ratio = paired(times[best_ort], t)
            row["speedup_vs_best_ort"] = round(ratio.median, 3)
            row["speedup_rounds"] = [round(r, 3) for r in ratio.rounds]
        rows.append(row)
    kv_bytes = 2 * case.seqs * (case.past + 1) * case.kv_heads * case.head_dim * 4
    return {
        "case": case.name,
        "sequences": case.seqs,
        "past_tokens": case.past,
        "heads": [case.q_heads, case.kv_heads, case.head_dim],
        "fp32_kv_bytes_read": kv_bytes,
        "best_ort": best_ort,
        "check": check,
        "rows": rows,
    }


def _refuse_wrong(errors: dict[str, float], tolerance: float) -> None:
    wrong = {k: v for k, v in errors.items() if not v <= tolerance}
    if wrong:
        raise SystemExit(f"wrong results, not timed (tolerance {tolerance}): {wrong}")


def _isa_flags() -> dict[str, bool]:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {f: f in flags for f in ISA_FLAGS}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
