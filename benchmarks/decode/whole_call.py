"""Whole generate calls, timed from outside: the independent check of the decode benchmark's
per-token numbers (issue 27: "two harnesses disagree on pydoc-16m at batch 1").

decode.py times each token as the step that made it returns and reports decode tok/s with the
prefill apart (TTFT). This harness shares none of that code: each engine in its own process
(whole_call_worker.py) runs `--calls` whole calls of one 32-token prompt with `--tokens` new
tokens, greedy, and the rate is the tokens a call returned over the call's wall time
(prefill, every step, sampling and the Python around them included). Both with EOS ignored
(the decode benchmark's protocol: every call returns `--tokens` tokens) and with EOS honoured
(what a call that stops at the model's EOS returns). Same artifact and peer model as
decode.py (artifact.py's recipe, peers.py's onnxruntime-genai build); interleaved rounds,
medians, the host load recorded and a loaded run refused.

    .venv/bin/python -m benchmarks.decode.whole_call [--models pydoc-16m] [--rounds 3]
        [--calls 5] [--tokens 128] [--threads 2] [--ortgenai-python PY] [--out-dir DIR]
        [--models-dir DIR] [--eval-text FILE] [--report-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import build_decode_artifact
from benchmarks.decode.models import MODELS, prepare_model
from benchmarks.decode.peers import ORTGENAI, build_ortgenai, set_ortgenai_threads
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave, paired, ranged

STEM = "whole_call"
WORKER = "benchmarks.decode.whole_call_worker"
TIMEOUT_S = 1800


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    settings = {k: getattr(args, k) for k in ("rounds", "calls", "tokens", "threads")}
    report: dict[str, Any] = {"benchmark": STEM, "machine": machine_info(), "settings": settings}
    report["versions"] = {ORTGENAI: peer_version(args.ortgenai_python, ORTGENAI)}
    report["models"] = {}
    with tempfile.TemporaryDirectory(prefix="whole-call-") as tmp:
        for name in args.models:
            model = prepare_model(name, args.models_dir.resolve(), args.eval_text.resolve())
            artifact = build_decode_artifact(model, Path(tmp), args.threads, TIMEOUT_S)
            built, og_dir = build_ortgenai(model, args.ortgenai_python, TIMEOUT_S)
            if og_dir is not None:
                set_ortgenai_threads(og_dir, args.threads)
            paths = {"ingot": artifact, ORTGENAI: str(og_dir) if og_dir else None}
            report["models"][name] = _model(list(model.prompt_ids), paths, args, Path(tmp), watch)
    report["load"] = watch.record()
    report["refused"] = watch.refusal()
    return publish(report, args.out_dir, STEM, _markdown)


def _model(prompt, paths, args, tmp: Path, watch: LoadWatch) -> dict[str, Any]:
    cases = [(engine, eos) for eos in (True, False) for engine in paths]

    def run(case: tuple[str, bool], _: int) -> dict[str, Any]:
        engine, ignore_eos = case
        if paths[engine] is None:
            return {"ok": False, "error": f"{engine}: no model (see its build)"}
        spec = {"engine": engine, "path": paths[engine], "prompt": prompt}
        spec |= {"tokens": args.tokens, "calls": args.calls, "ignore_eos": ignore_eos}
        python = args.ortgenai_python if engine == ORTGENAI else None
        try:
            result = run_worker(WORKER, spec, tmp, TIMEOUT_S, python)
        except WorkerFailed as e:
            result = {"ok": False, "error": str(e)}
        watch.sample()
        if result.get("ok"):
            result["tok_s"] = result["tokens"][0] / statistics.median(result["call_s"])
            print(f"[whole_call] {engine} ignore_eos={ignore_eos}: {result['tok_s']:.1f}")
        return result

    rounds = interleave(cases, args.rounds, run)
    out: dict[str, Any] = {}
    for ignore_eos in (True, False):
        key = "eos_ignored" if ignore_eos else "eos_honoured"
        out[key] = {e: _merge(rounds[(e, ignore_eos)]) for e in paths}
        ingot, peer = out[key]["ingot"], out[key][ORTGENAI]
        if ingot.get("ok") and peer.get("ok"):
            ratio = paired(ingot["tok_s_rounds"], peer["tok_s_rounds"])
            ingot["vs_peer"], ingot["vs_peer_rounds"] = ratio.median, ratio.rounds
    return out


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    failed = next((r for r in results if not r.get("ok")), None)
    if failed is not None:
        return failed
    rates = [r["tok_s"] for r in results]
    return {
        "ok": True,
        "tok_s": statistics.median(rates),
        "tok_s_rounds": rates,
        "call_ms": statistics.median(s for r in results for s in r["call_s"]) * 1e3,
        "tokens_per_call": sorted({t for r in results for t in r["tokens"]}),
        "first_tokens": results[0]["first_tokens"],
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
    }


def _markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        "# Whole generate calls: ingot and onnxruntime-genai (the decode benchmark's check)",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores; onnxruntime-genai "
        f"{report['versions'].get(ORTGENAI)}. One 32-token prompt, {s['tokens']} new tokens, "
        f"greedy, {s['threads']} threads; {s['calls']} timed calls per process after one "
        f"untimed, {s['rounds']} interleaved rounds. tok/s = tokens the call returned / the "
        "call's wall time (median call), the prefill and everything around the steps "
        "included; ingot / peer = the median of the rounds' paired ratios.",
        "",
        "| model | EOS | engine | tok/s (rounds) | ms a call | tokens a call | ingot / peer |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, model in report["models"].items():
        for key, engines in model.items():
            for engine, r in engines.items():
                head = f"| {name} | {key.split('_')[1]} | {engine}"
                if not r.get("ok"):
                    lines.append(f"{head} | failed: `{r.get('error')}` | | | |")
                    continue
                rates = r["tok_s_rounds"]
                tokens = "/".join(map(str, r["tokens_per_call"]))
                ratio = ranged(r.get("vs_peer"), r.get("vs_peer_rounds") or [], "x")
                lines.append(
                    f"{head} | {r['tok_s']:.1f} ({min(rates):.1f}–{max(rates):.1f}) | "
                    f"{r['call_ms']:.1f} | {tokens} | {ratio} |"
                )
    return "\n".join([*lines, "", load_line(report["load"], report.get("refused")), ""])


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["pydoc-16m"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per process")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ortgenai-python", type=Path, default=peer_python(ORTGENAI))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--models-dir", type=Path, default=models_dir())
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
