"""The OpenVINO spike's report: paired ratios to ingot's engine, and the markdown, rendered from
the JSON alone (benchmarks/spike/openvino.py writes it; `--report-only` renders it again)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.harness.load import load_line
from benchmarks.harness.rounds import paired, ranged

__all__ = ["CASE_TITLES", "case_section", "markdown", "model_sections", "pair_with_ingot"]

CASE_TITLES = {
    "batch1": "Batch 1, 32-token prompt",
    "long": "Batch 1, long prompt (context ~4096; pydoc-16m: 1024, its maximum)",
    "batched": "32 sequences decoding together, 32-token prompts",
}


def pair_with_ingot(engines: dict[str, dict[str, Any]]) -> None:
    """Each other engine gains `vs_ingot` (its tok/s over ingot's, round by round),
    `ttft_ingot_over` (ingot's TTFT over its own) and `greedy_agree` (leading tokens equal to
    ingot's, the mean over sequences); the token lists are then dropped."""
    ingot = engines.get("ingot", {})
    for name, case in engines.items():
        if name == "ingot" or not (case.get("ok") and ingot.get("ok")):
            continue
        a, b = case.get("rounds") or [], ingot.get("rounds") or []
        if len(a) == len(b) and a:
            rate = paired([r["tokens_per_s"] for r in a], [r["tokens_per_s"] for r in b])
            case["vs_ingot"], case["vs_ingot_rounds"] = rate.median, rate.rounds
            ttft = paired([r["ttft_s"] for r in ingot["runs"]], [r["ttft_s"] for r in case["runs"]])
            case["ttft_ingot_over"], case["ttft_ingot_over_rounds"] = ttft.median, ttft.rounds
        mine, theirs = case.get("tokens") or [], ingot.get("tokens") or []
        if mine and theirs:
            case["greedy_agree"] = statistics.mean(
                _leading(x, y) for x, y in zip(mine, theirs, strict=True)
            )
    for case in engines.values():
        case.pop("tokens", None)


def _leading(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = ", ".join(
        f"{venv}: " + ", ".join(f"{k} {v}" for k, v in libs.items())
        for venv, libs in report["versions"].items()
    )
    lines = [
        "# Spike: OpenVINO as ingot's second engine (issue 27)",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores; {versions}.",
        "",
        "Both engines run one ingot artifact (RTN int4 g32 symmetric on every linear, lm_head "
        "included) through ingot's own Generator (scheduler, block allocator, batches; prefix "
        "caching off). `ingot`: its ONNX Runtime engine (MatMulNBits at accuracy level 4: int8 "
        "activations; fp32 KV in blocks of 16). `openvino-*`: the same codes and scales read "
        "from the artifact's portable graph and rebuilt with OpenVINO's graph API as int4 "
        "weight-compressed MatMuls and its PagedAttention operation over ingot's block tables "
        "(blocks of 32, the CPU plugin's), compiled by its CPU plugin: `openvino-f32` with f32 "
        "activations (int8 dynamically quantized in groups of 32 inside the int4 kernels) and "
        "f32 KV, `openvino` with the plugin's defaults on this CPU (bf16 activations, u8 KV "
        "with per-block scales). 2 threads; each engine in its own process per round (load, "
        "warm-up, one timed run), engines in turn, the order rotated; medians over rounds, "
        "ratios paired within a round (range in brackets).",
        "",
    ]
    lines += model_sections(report, _check_section)
    lines += [
        "Notes:",
        "",
        "- Each part (check, batch1, batched, long) of each model is its own invocation; the "
        "date above is the last one's, the host load line covers every part's samples.",
        "- Greedy = ingot: leading tokens equal to ingot's engine, the mean over sequences. "
        "The 1B shape has random weights: its argmax is near a tie everywhere, so any two "
        "engines part within a few tokens there; pydoc-16m's is the meaningful one.",
        "- Peak RSS of the OpenVINO rows includes building the model in the worker (the portable "
        "graph read by the ONNX frontend, the codes repacked to [N, K/g, g] in numpy): an "
        "engine built ahead of time would load its IR instead (the JSON's `info.compile_s` is "
        "the compile alone; `load_s` the whole load).",
        "",
        load_line(report["load"], report.get("refused")),
        "",
    ]
    return "\n".join(lines)


def _check_section(model: str, check: dict[str, Any]) -> list[str]:
    lines = [f"## Correctness: {model}", ""]
    if not check.get("ok"):
        return [*lines, f"Check failed: `{check.get('error')}`", ""]
    lines += [
        f"Logits of every token of two sequences ({check['tokens_compared']} tokens, uneven "
        "chunks, a prefill chunk batched beside a decode, scattered block ids) against the "
        "portable graph in a plain ONNX Runtime session (exact: the IR's numbers) and against "
        "ingot's ONNX Runtime engine; relative difference = max |a - b| / max |reference|. "
        "Greedy: 32 tokens from the benchmark's prompt through ingot's Generator on each "
        "engine, leading tokens equal to ingot's engine.",
        "",
        "| engine | vs exact: max rel diff | argmax equal | vs ingot's engine: max rel diff "
        "| greedy = ingot (of 32) |",
        "|---|---:|---:|---:|---:|",
    ]
    ingot = check["ingot_engine_vs_exact"]
    lines.append(
        f"| ingot (ONNX Runtime engine) | {ingot['max_rel_diff']:.2e} | "
        f"{ingot['argmax_equal']}/{ingot['rows']} | – | – |"
    )
    for name, row in check["openvino"].items():
        exact = row["vs_exact"]
        engine = row.get("vs_ingot_engine")
        title = (
            "openvino, exact (f32, no activation quantization, f32 KV)" if name == "exact" else name
        )
        vs_engine = f"{engine['max_rel_diff']:.2e}" if engine else "–"
        lines.append(
            f"| {title} | {exact['max_rel_diff']:.2e} | {exact['argmax_equal']}/{exact['rows']} "
            f"| {vs_engine} | {row.get('greedy_agree', '–')} |"
        )
    route_a = check.get("route_a")
    if route_a:
        lines += ["", _route_a_line(route_a)]
    return [*lines, ""]


def _route_a_line(route_a: dict[str, Any]) -> str:
    parts = []
    for name in ("exact", "default"):
        row = route_a.get(name, {})
        if "error" in row:
            parts.append(f"{name}: failed, `{row['error']}`")
            continue
        layers = row.get("runtime_layers", {})
        kept = ", ".join(
            f"{k} {layers[k]}"
            for k in ("Gather", "ScatterNDUpdate", "FullyConnected")
            if k in layers
        )
        parts.append(f"{name}: max rel diff {row['vs_exact']['max_rel_diff']:.2e}; runs {kept}")
    return (
        "Route A (the portable model.onnx read by OpenVINO's ONNX frontend, pools copied back "
        "after each call: ScatterNDUpdate writes a new pool tensor): " + "; ".join(parts) + "."
    )


def model_sections(
    report: dict[str, Any], check_section: Callable[[str, dict[str, Any]], list[str]]
) -> list[str]:
    """Each model's check (drawn by the route's `check_section`), then one table per case
    (CASE_TITLES) over the models that measured it."""
    lines: list[str] = []
    for name, entry in report.get("models", {}).items():
        if entry.get("check"):
            lines += check_section(name, entry["check"])
    for part, title in CASE_TITLES.items():
        rows = [(n, e.get("cases", {}).get(part)) for n, e in report.get("models", {}).items()]
        rows = [(n, c) for n, c in rows if c]
        if rows:
            lines += case_section(title, rows)
    return lines


def case_section(title: str, rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| model | prompt | new | engine | tok/s (rounds) | TTFT s | TPOT p50 / p99 ms "
        "| engine / ingot tok/s | ingot / engine TTFT | peak RSS MiB | greedy = ingot |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, case in rows:
        prompt = "/".join(map(str, case["prompt_tokens"]))
        if case["sequences"] > 1:
            prompt = f"{case['sequences']} x {prompt}"
        for engine, r in case["engines"].items():
            head = f"| {model} | {prompt} | {case['new_tokens']} | {engine}"
            if not r.get("ok"):
                lines.append(f"{head} | failed: `{r.get('error')}` | | | | | | |")
                continue
            rates = [x["tokens_per_s"] for x in r["rounds"]]
            spread = f" ({min(rates):.1f}–{max(rates):.1f})" if len(rates) > 1 else ""
            agree = r.get("greedy_agree")
            agreed = "–" if agree is None else f"{agree:.1f}/{case['new_tokens']}"
            lines.append(
                f"{head} | {r['tokens_per_s']:.1f}{spread} | {r['ttft_s']:.2f} | "
                f"{_ms(r.get('tpot_p50_s'))} / {_ms(r.get('tpot_p99_s'))} | "
                f"{ranged(r.get('vs_ingot'), r.get('vs_ingot_rounds') or [], 'x')} | "
                f"{ranged(r.get('ttft_ingot_over'), r.get('ttft_ingot_over_rounds') or [], 'x')} | "
                f"{(r.get('peak_rss_bytes') or 0) / 2**20:.0f} | "
                f"{agreed} |"
            )
    return [*lines, ""]


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f}"
