"""benchmarks.spike.kernels' markdown, rendered from its JSON alone."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.load import load_line
from benchmarks.harness.rounds import ranged


def markdown(report: dict[str, Any]) -> str:
    m, bw, lin = report["machine"], report["bandwidth"], report["linears"]
    flags = ", ".join(f for f, present in report["isa"].items() if present)
    absent = ", ".join(f for f, present in report["isa"].items() if not present) or "none"
    peaks = lin["vnni_peak_macs_per_s"]
    threads = report["threads"]
    peak_text = ", ".join(
        f"{v / 1e9:.0f} G/s on {t} thread{'s' if t != '1' else ''}" for t, v in peaks.items()
    )
    others = lin.get("madd_peaks_macs_per_s", {})
    other_text = ", ".join(f"{name} {v / 1e9:.0f} G/s" for name, v in others.items())
    lines = [
        "# Kernels of our own: int4 GEMV / GEMM with VNNI and paged attention, beside ONNX Runtime",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores; onnxruntime "
        f"{m['versions']['onnxruntime']}; {threads} threads everywhere. Our kernels: "
        "spike/kernels/ (C++, g++ 12, AVX-512 VNNI build), through ctypes. Medians of "
        f"{report['rounds']} interleaved rounds, each case after a 0.1 s pause "
        f"({report['duration_s']} s in all).",
        "",
        f"ISA flags present: {flags}; absent: {absent}.",
        "",
        "DRAM read bandwidth at the start (benchmarks/harness/machine.py): "
        f"{bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['bound_method']}). int8 multiply-add peak "
        f"(independent vpdpbusd on registers, best of the rounds): {peak_text}."
        + (
            f" Every kind of multiply-add the same way (int8 vpdpbusd, bf16 vdpbf16ps, fp32 "
            f"FMA): {other_text}."
            if others
            else ""
        ),
        "",
    ]
    lines += _linears(
        "The 1B shape's decode linears: 4 layers of q|k|v, o, gate|up, down",
        lin,
    )
    lines += _linears("The lm_head, 128256 x 2048", report["lm_head"])
    lines += _attention(report["attention"])
    lines += ["", load_line(report["load"], report["refused"]), ""]
    return "\n".join(lines)


def _linears(title: str, lin: dict[str, Any]) -> list[str]:
    lines = [
        f"## {title}",
        "",
        f"int4 g32 symmetric, the same weights both sides: ORT {lin['ort_weight_bytes'] / 1e6:.0f} "
        f"MB (fp32 scales), ours {lin['our_weight_bytes'] / 1e6:.0f} MB (fp16 scales). Bound: "
        f"a 1 GiB torch sum in the same rounds, median {lin['bandwidth_bytes_per_s'] / 1e9:.1f} "
        f"GB/s ({min(lin['bandwidth_rounds'])}–{max(lin['bandwidth_rounds'])}). "
        "Of bound: each round's weight GB/s over that round's bound, median. "
        "int8 MAC/s counts M x K x N multiply-adds; of peak: over the vpdpbusd peak on these "
        "threads. Speedup: the faster ORT variant's time over ours, per round (median, range).",
        "",
        "| M | case | ms | weight GB/s | of bound | G int8 MAC/s | of VNNI peak | speedup |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lin["rows"]:
        speedup = (
            ranged(r["speedup_vs_best_ort"], r["speedup_rounds"], "x")
            if "speedup_vs_best_ort" in r
            else ""
        )
        lines.append(
            f"| {r['m']} | {r['case']} | {r['ms']} | {r['weight_gb_per_s']} | "
            f"{r['fraction_of_bound']:.2f} | {r['gmac_per_s']} | "
            f"{r['fraction_of_vnni_peak']:.2f} | {speedup} |"
        )
    lines += [
        "",
        "Checked first (max |difference| over the reference's largest |value|; numpy in float64 "
        "on the dequantized weights): ours against x rounded as ours rounds it (its arithmetic "
        "alone), ours and ORT against x in fp32 (the int8 activations' error).",
        "",
        "| linear | M | ours vs rounded x | ours vs fp32 x | ORT level 4 vs fp32 x |",
        "|---|---:|---:|---:|---:|",
        *[
            f"| {c['linear']} | {c['m']} | {c['ours_vs_q8_x']:.1e} | {c['ours_vs_fp32_x']:.1e} "
            f"| {c['ort_level4_vs_fp32_x']:.1e} |"
            for c in lin["check"]
        ],
        "",
    ]
    return lines


def _attention(cases: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Paged decode attention, one layer, one new token per sequence",
        "",
        "ORT: kernel_ceiling.py's graphs (gather the blocks + concat the new token + Attention; "
        "scatter the new token into the pool + gather + Attention), intra-op spinning off. "
        "Ours: the new token written into the pool, then the pool read in place through the "
        "block tables (fp32; int8 codes with a scale per KV head). Blocks of 16. Speedup: the "
        "faster ORT graph's time over ours, per round.",
        "",
        "| case | path | µs per layer | fp32 KV GB/s | speedup |",
        "|---|---|---:|---:|---:|",
    ]
    for c in cases:
        for r in c["rows"]:
            speedup = (
                ranged(r["speedup_vs_best_ort"], r["speedup_rounds"], "x")
                if "speedup_vs_best_ort" in r
                else ""
            )
            gbs = "" if "int8" in r["case"] else f"{c['fp32_kv_bytes_read'] / r['us'] / 1e3:.1f}"
            lines.append(f"| {c['case']} | {r['case']} | {r['us']} | {gbs} | {speedup} |")
    lines += [
        "",
        "Checked first (max |difference| over the reference's largest |value|):",
        "",
        "| case | ours fp32 vs numpy | ORT vs numpy | ours fp32 vs ORT | ours int8 vs numpy |",
        "|---|---:|---:|---:|---:|",
        *[
            f"| {c['case']} | {c['check']['ours_fp32_vs_numpy']:.1e} | "
            f"{c['check']['ort_vs_numpy']:.1e} | {c['check']['ours_fp32_vs_ort']:.1e} | "
            f"{c['check']['ours_int8_vs_numpy']:.1e} |"
            for c in cases
        ],
    ]
    return lines
