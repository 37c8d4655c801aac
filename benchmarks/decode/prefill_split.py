"""What splitting a step's prefill by chunk length (scheduler.split_prefill) buys: a burst of
new prompts of mixed lengths through the runtime, split (the default) against one padded call a
step, side by side.

Reproduce (about 2 minutes on 2 cores once decode.py has built pydoc-16m into the benchmark
cache, else it builds it first; writes benchmarks/results/prefill_split.json and .md; a run
whose host load exceeded the thread count is refused):

    .venv/bin/python -m benchmarks.decode.prefill_split [--rounds 5] [--requests 32]
        [--min-len 64] [--max-len 256] [--output-len 64] [--threads 2] [--out-dir DIR]
        [--report-only]

serve.py's workload in process: prompts drawn from held-out text, lengths uniform in
[min-len, max-len], new prompts every round (the same for both cases in a round), greedy,
EOS ignored, decode.py's pydoc-16m weights (int4 g32, accuracy level 4), prefix caching on.
Each case runs in its own process, once per round, in turn (the order rotated per round);
ratios are split / one call, paired per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import build_decode_artifact
from benchmarks.decode.models import prepare_model
from benchmarks.harness.launch import run_worker
from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave, paired, ranged
from benchmarks.serve.workload import make_prompts

STEM = "prefill_split"
WORKER = "benchmarks.decode.prefill_split_worker"
CASES = ("split", "one_call")
MODEL = "pydoc-16m"
KV_CACHE_BYTES = 256 << 20
BUDGET = 2048  # max_num_batched_tokens, the runtime's default
WORKER_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ingot-split-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = prepare_model(MODEL, models_dir(), data_dir() / "pydoc-eval.txt")
        artifact = build_decode_artifact(model, tmp, args.threads, BUILD_TIMEOUT_S)
        watch.sample()
        rounds = _measure(artifact, args, tmp, watch)
    report = {
        "benchmark": "prefill_split",
        "machine": machine_info(),
        "settings": {
            "model": MODEL,
            "rounds": args.rounds,
            "requests": args.requests,
            "prompt_len": [args.min_len, args.max_len],
            "output_len": args.output_len,
            "threads": args.threads,
            "max_num_batched_tokens": BUDGET,
        },
        "rounds": rounds,
        "summary": _summary(rounds),
        "load": watch.record(),
        "refused": watch.refusal(),
        "duration_s": round(time.perf_counter() - started, 1),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _measure(
    artifact: str, args: argparse.Namespace, tmp: Path, watch: LoadWatch
) -> list[dict[str, Any]]:
    """Per round: both cases on that round's new prompts, each in its own process."""
    tokenizer = Path(artifact) / "tokenizer.json"
    text = data_dir() / "pydoc-eval.txt"
    prompts = [
        make_prompts(tokenizer, text, args.requests, args.min_len, args.max_len, seed=1000 + i)
        for i in range(args.rounds)
    ]

    def run(case: str, index: int) -> dict[str, Any]:
        spec = {
            "case": case,
            "artifact": artifact,
            "prompts": prompts[index],
            "output_len": args.output_len,
            "kv_cache_bytes": KV_CACHE_BYTES,
            "budget": BUDGET,
        }
        return run_worker(WORKER, spec, tmp, WORKER_TIMEOUT_S)

    results = interleave(CASES, args.rounds, run, after_case=watch.sample)
    rounds = []
    for index in range(args.rounds):
        cases = {case: results[case][index] for case in CASES}
        same = cases["split"].pop("tokens") == cases["one_call"].pop("tokens")
        rounds.append({"cases": cases, "same_tokens": same})
    return rounds


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each case's figures, and of the paired split / one-call ratios."""
    out: dict[str, Any] = {}
    for case in CASES:
        per = [r["cases"][case] for r in rounds]
        out[case] = {
            key: statistics.median(p[key] for p in per)
            for key in ("output_tok_s", "wall_s", "prefill_s", "decode_s", "prefill_calls")
        }
        out[case]["padding"] = statistics.median(
            p["prefill_computed"] / p["prefill_real"] for p in per
        )
    for key in ("output_tok_s", "prefill_s"):
        per_case = {case: [r["cases"][case][key] for r in rounds] for case in CASES}
        ratio = paired(per_case["split"], per_case["one_call"])
        out[f"ratio_{key}"] = {"median": ratio.median, "rounds": ratio.rounds}
    out["same_tokens_rounds"] = sum(r["same_tokens"] for r in rounds)
    return out


def _markdown(report: dict[str, Any]) -> str:
    m, s, summary = report["machine"], report["settings"], report["summary"]
    lines = [
        "# Prefill split by chunk length against one padded call",
        "",
        f"{m['date']} on {m['cpu_model']}, {s['threads']} threads. {s['model']} (decode.py's "
        f"weights: int4 g32, accuracy level 4), {s['requests']} new prompts of "
        f"{s['prompt_len'][0]}-{s['prompt_len'][1]} tokens at once (held-out text), "
        f"{s['output_len']} greedy tokens each, max_num_batched_tokens "
        f"{s['max_num_batched_tokens']}. {s['rounds']} rounds, each case in its own process "
        "once per round, in turn; "
        "medians. `split`: the runtime's default (scheduler.split_prefill, up to 4 calls of "
        "similar lengths); `one_call`: every step's prefill chunks in one call padded to the "
        "longest (MAX_PREFILL_CALLS = 1). Padding: prefill tokens computed / real.",
        "",
        "| case | output tok/s | wall s | prefill s | decode s | prefill calls | padding |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        c = summary[case]
        lines.append(
            f"| {case} | {c['output_tok_s']:.0f} | {c['wall_s']:.2f} | {c['prefill_s']:.2f} | "
            f"{c['decode_s']:.2f} | {c['prefill_calls']:.0f} | {c['padding']:.2f}x |"
        )
    tok, pre = summary["ratio_output_tok_s"], summary["ratio_prefill_s"]
    lines += [
        "",
        f"- split / one call, output tok/s: {ranged(tok['median'], tok['rounds'], 'x')}; "
        f"prefill time: {ranged(pre['median'], pre['rounds'], 'x')}.",
        f"- Greedy tokens identical in both cases in {summary['same_tokens_rounds']} of "
        f"{s['rounds']} rounds.",
        "",
        load_line(report["load"], report["refused"]),
        "",
    ]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
