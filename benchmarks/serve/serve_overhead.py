"""What serving over HTTP costs: `ingot serve` against the same Generator in process, side by
side, at one client and at a burst; and the server with ONNX Runtime's threads sleeping
between calls instead of spinning (load_served_model's `spinning`).

Reproduce (about 3 minutes on 2 cores once decode.py has built pydoc-16m into the benchmark
cache, else it builds it first; writes benchmarks/results/serve_overhead.json and .md; a run
whose host load exceeded the thread count is refused):

    .venv/bin/python -m benchmarks.serve.serve_overhead [--rounds 7] [--one-client 16]
        [--burst 32] [--output-len 64] [--threads 2] [--out-dir DIR] [--report-only]

Cases, each in its own process once per round, in turn (the order rotated per round):
`in_process`, engines.py's ingot-batch1 (one request at a time) and ingot-offline (all
at once) on the Generator; `http`, a fresh `ingot serve` as it ships (spinning threads), one
client sending `--one-client` requests one at a time over one connection, then `--burst`
requests at once; `http_sleeping`, the same server with spinning off. A spinning thread pool
answers the next parallel section without a wake-up and takes a core while it waits; the
server's event loop and, on this host, the load generator need cores too. Every case gets the
same new prompts in a round (serve.py's workload: held-out text, 64-256 tokens, greedy, EOS
ignored, decode.py's pydoc-16m weights), each warmed up on its first prompt. Ratios are paired
per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
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
from benchmarks.serve.client import run_requests, run_sequential
from benchmarks.serve.server import ServerProcess, free_port, ingot_command, with_cpu
from benchmarks.serve.workload import make_prompts, summarize

STEM = "serve_overhead"
WORKER = "benchmarks.serve.engines"

CASES = ("in_process", "http", "http_sleeping")
RUNS = ("one_client", "burst")
# Paired ratios reported: (numerator case, denominator case, what it says).
RATIOS = (
    ("http", "in_process", "ingot serve / the Generator in process"),
    ("http_sleeping", "http", "ingot serve, threads sleeping / spinning"),
)
IN_PROCESS_ENGINES = {"one_client": "ingot-batch1", "burst": "ingot-offline"}  # engines.py
MODEL = "pydoc-16m"
KV_CACHE_BYTES = 256 << 20
PROMPT_LENS = (64, 256)
WARM_UP_TOKENS = 8  # as engines.run_spec's warm-up
SERVER_START_TIMEOUT_S = 300
WORKER_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ingot-serve-overhead-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = prepare_model(MODEL, models_dir(), data_dir() / "pydoc-eval.txt")
        artifact = build_decode_artifact(model, tmp, args.threads, BUILD_TIMEOUT_S)
        watch.sample()
        rounds = _measure(Path(artifact), args, tmp, watch)
    report = {
        "benchmark": "serve_overhead",
        "machine": machine_info(),
        "settings": {
            "model": MODEL,
            "rounds": args.rounds,
            "one_client_requests": args.one_client,
            "burst_requests": args.burst,
            "prompt_len": list(PROMPT_LENS),
            "output_len": args.output_len,
            "threads": args.threads,
        },
        "rounds": rounds,
        "summary": _summary(rounds),
        "load": watch.record(),
        "refused": watch.refusal(),
        "duration_s": round(time.perf_counter() - started, 1),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _measure(
    artifact: Path, args: argparse.Namespace, tmp: Path, watch: LoadWatch
) -> list[dict[str, Any]]:
    tokenizer, text = artifact / "tokenizer.json", data_dir() / "pydoc-eval.txt"
    prompts = [
        {
            "one_client": make_prompts(
                tokenizer, text, args.one_client, *PROMPT_LENS, seed=2000 + i
            ),
            "burst": make_prompts(tokenizer, text, args.burst, *PROMPT_LENS, seed=3000 + i),
        }
        for i in range(args.rounds)
    ]

    def run(case: str, index: int) -> dict[str, Any]:
        if case == "in_process":
            return _in_process(artifact, prompts[index], args, tmp)
        return _serve(artifact, case == "http", prompts[index], args, tmp)

    results = interleave(CASES, args.rounds, run, after_case=watch.sample)
    return [{case: results[case][index] for case in CASES} for index in range(args.rounds)]


def _in_process(
    artifact: Path, prompts: dict[str, list[list[int]]], args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """engines.py's ingot cases, each in its own process: the Generator, no HTTP."""
    out = {}
    for run, engine in IN_PROCESS_ENGINES.items():
        spec = {
            "engine": engine,
            "artifact": str(artifact),
            "kv_cache_bytes": KV_CACHE_BYTES,
            "max_num_seqs": args.burst,
            "prompts": prompts[run],
            "output_len": args.output_len,
        }
        result = run_worker(WORKER, spec, tmp, WORKER_TIMEOUT_S)
        if not result.get("ok"):
            raise SystemExit(f"in process, {engine}: {result.get('error')}")
        result.pop("timings")
        out[run] = result
    return out


def _serve(
    artifact: Path,
    spinning: bool,
    prompts: dict[str, list[list[int]]],
    args: argparse.Namespace,
    tmp: Path,
) -> dict[str, Any]:
    """A fresh server: the one-client run, then the burst, each warmed up on its first prompt
    (as the in-process cases are) and measured with its CPU per token."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command, env = ingot_command(artifact, port, args.burst, KV_CACHE_BYTES, spinning)
    server = ServerProcess(command, tmp / "server.log", env)
    server.start(base, SERVER_START_TIMEOUT_S)
    n, out = args.output_len, {}
    try:
        for run, requests in prompts.items():
            run_requests(base, requests[:1], WARM_UP_TOKENS, [0.0])
            out[run] = with_cpu(server, partial(_send, base, run, requests, n))
    finally:
        server.stop()
    return out


def _send(base: str, run: str, requests: list[list[int]], output_len: int) -> dict[str, Any]:
    if run == "one_client":
        return summarize(run_sequential(base, requests, output_len))
    return summarize(run_requests(base, requests, output_len, [0.0] * len(requests)))


def _figures(run: dict[str, Any]) -> dict[str, float | None]:
    cpu = run.get("cpu_us_per_token", {})
    return {
        "output_tok_s": run["output_tokens_per_s"],
        "ttft_p50_ms": run["ttft_s"]["p50"] * 1e3,
        "itl_p50_ms": run["itl_s"]["p50"] * 1e3,
        "tpot_p50_ms": run["tpot_s"]["p50"] * 1e3,
        "event_loop_us": cpu.get("event_loop"),
        "engine_threads_us": cpu.get("engine_threads"),
        "client_us": cpu.get("client"),
    }


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run and case the medians over rounds; per run the paired RATIOS of throughput and
    TPOT."""
    out: dict[str, Any] = {}
    for run in RUNS:
        per_case = {c: [_figures(r[c][run]) for r in rounds] for c in CASES}
        out[run] = {
            c: {k: _median([f[k] for f in figs]) for k in figs[0]} for c, figs in per_case.items()
        }
        for num, den, _ in RATIOS:
            for key in ("output_tok_s", "tpot_p50_ms"):
                ratio = paired([f[key] for f in per_case[num]], [f[key] for f in per_case[den]])
                out[run][f"{num}/{den}:{key}"] = {"median": ratio.median, "rounds": ratio.rounds}
    return out


def _median(values: list[float | None]) -> float | None:
    return None if None in values else statistics.median(values)


def _markdown(report: dict[str, Any]) -> str:
    m, s, summary = report["machine"], report["settings"], report["summary"]
    lines = [
        "# What serving over HTTP costs: ingot serve against the Generator in process",
        "",
        f"{m['date']} on {m['cpu_model']}, {s['threads']} threads. {s['model']} (decode.py's "
        f"weights: int4 g32, accuracy level 4), new prompts of {s['prompt_len'][0]}-"
        f"{s['prompt_len'][1]} tokens (held-out text), {s['output_len']} greedy tokens each. "
        f"One client: {s['one_client_requests']} requests one at a time (over HTTP: streamed, "
        f"over one connection); burst: {s['burst_requests']} at once. {s['rounds']} rounds, "
        "each case in its own process once per round, in turn; medians. `in_process`: the "
        "Generator (serve/engines.py); `http`: `ingot serve` as it ships; `http_sleeping`: "
        "the same with ONNX Runtime's threads sleeping between calls. CPU: µs per output token "
        "of the server's event loop, its other threads (the generator and ONNX Runtime's) and "
        "the HTTP client, the load generator (serve/server.py: with_cpu).",
        "",
        "| run | case | output tok/s | TTFT p50 ms | ITL p50 ms | TPOT p50 ms | CPU: event "
        "loop | engine threads | client |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in RUNS:
        for case in CASES:
            f = summary[run][case]
            cpu = [_us(f[k]) for k in ("event_loop_us", "engine_threads_us", "client_us")]
            lines.append(
                f"| {run.replace('_', ' ')} | {case} | {f['output_tok_s']:.0f} | "
                f"{f['ttft_p50_ms']:.1f} | {f['itl_p50_ms']:.2f} | {f['tpot_p50_ms']:.2f} | "
                + " | ".join(cpu)
                + " |"
            )
    lines.append("")
    for run in RUNS:
        for num, den, meaning in RATIOS:
            tok = summary[run][f"{num}/{den}:output_tok_s"]
            tpot = summary[run][f"{num}/{den}:tpot_p50_ms"]
            lines.append(
                f"- {run.replace('_', ' ')}, {meaning}: output tok/s {_ranged(tok)}, "
                f"TPOT p50 {_ranged(tpot)}."
            )
    lines += ["", load_line(report["load"], report["refused"]), ""]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _ranged(ratio: dict[str, Any]) -> str:
    return ranged(ratio["median"], ratio["rounds"], "x")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--one-client", type=int, default=16, help="requests, one at a time")
    parser.add_argument("--burst", type=int, default=32, help="requests at once")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
