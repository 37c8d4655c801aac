"""Where ingot's batch-1 gap to onnxruntime-genai is: the graph, or the loop around it.

Reproduce (about 8 minutes on 2 cores once decode.py has built the models into the benchmark
cache, else it builds them first; writes benchmarks/results/batch1_gap.json and .md; a run whose
host load exceeded the thread count is refused):

    benchmarks/peers/setup.sh onnxruntime-genai
    .venv/bin/python -m benchmarks.decode.batch1_gap [--models pydoc-16m,llama-1b-shape]
        [--rounds 5] [--threads 2] [--out-dir DIR] [--report-only]

decode.py's models and weights (int4 g32, MatMulNBits accuracy level 4 on both sides), a
32-token prompt and 127 decode steps. Four cases, each in its own process (two sessions in one
process disturb each other's spinning threads), one process per case per round, the cases in
turn with the order rotated each round:

- `ingot_step`: the runtime's Generator.step over a greedy decode (what decode.py times);
- `ingot_graph`: ingot's engine session alone, run again and again on the binding a decode step
  at the mean context left: no Python between calls;
- `ortgenai_step`: onnxruntime-genai's generate_next_token over the same decode (its C++ loop);
- `ortgenai_graph`: onnxruntime-genai's model.onnx in a plain session at the same context,
  past and present sharing one buffer as its loop binds them.

So ingot_step / ortgenai_step (decode.py's ratio) factors into graph / graph (the kernels ORT
runs for each model) times each side's loop overhead (step / graph).

On pydoc-16m the rounds also time changed copies of ingot's engine graph
(batch1_gap_worker.VARIANTS), over the same pool and inputs as ingot_graph: without attention,
without the pool gathers (past K/V from a constant), and with each residual Add fused into the
next RMSNormalization (fewer nodes, the same work). Each one's saving, ingot_graph minus the
variant, says what that part of the graph costs.
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
from benchmarks.decode.models import MODELS, prepare_model
from benchmarks.decode.peers import ORTGENAI, build_ortgenai, set_ortgenai_threads
from benchmarks.harness.launch import run_worker
from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave, paired

STEM = "batch1_gap"
WORKER = "benchmarks.decode.batch1_gap_worker"
CASES = ("ingot_step", "ingot_graph", "ortgenai_step", "ortgenai_graph")
# Timed repeats per process (each one decode of 127 tokens); the 1B shape's take seconds each.
REPEATS = {"pydoc-16m": 7, "llama-1b-shape": 2}
# Changed copies of ingot's engine graph timed like ingot_graph (pydoc-16m only): what
# attention, the pool gathers and separate residual Adds cost.
ABLATIONS = ("no_attention", "no_pool_gather", "fused_skip_norm")
WORKER_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    models = {}
    with tempfile.TemporaryDirectory(prefix="ingot-gap-") as tmp_dir:
        for name in args.models:
            spec = _prepare(name, Path(tmp_dir), args)
            watch.sample()
            models[name] = _measure(spec, args, Path(tmp_dir), watch)
    report = {
        "benchmark": "batch1_gap",
        "machine": machine_info(),
        "peer_versions": {
            ORTGENAI: peer_version(args.ortgenai_python, ORTGENAI),
            "onnxruntime (with onnxruntime-genai)": peer_version(
                args.ortgenai_python, "onnxruntime"
            ),
        },
        "settings": {"rounds": args.rounds, "threads": args.threads, "prompt_tokens": 32},
        "models": models,
        "load": watch.record(),
        "refused": watch.refusal(),
        "duration_s": round(time.perf_counter() - started, 1),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _prepare(name: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The worker spec of `name`: decode.py's artifact and onnxruntime-genai model (built into
    the benchmark cache if they are not there yet)."""
    model = prepare_model(name, models_dir(), data_dir() / "pydoc-eval.txt")
    artifact = build_decode_artifact(model, tmp, args.threads, BUILD_TIMEOUT_S)
    record, ortgenai_dir = build_ortgenai(model, args.ortgenai_python, BUILD_TIMEOUT_S)
    if ortgenai_dir is None:
        raise SystemExit(f"{name}: onnxruntime-genai model builder failed: {record.get('error')}")
    set_ortgenai_threads(ortgenai_dir, args.threads)
    return {
        "artifact": artifact,
        "ortgenai_dir": str(ortgenai_dir),
        "prompt": list(model.prompt_ids),
        "threads": args.threads,
        "repeats": REPEATS[name],
    }


def _measure(
    spec: dict[str, Any], args: argparse.Namespace, tmp: Path, watch: LoadWatch
) -> dict[str, Any]:
    """Every case once per round, each in its own process, the order rotated per round;
    pydoc-16m's rounds also time the engine graph's ablations (batch1_gap_worker.VARIANTS)."""
    ablations = ABLATIONS if spec["repeats"] == REPEATS["pydoc-16m"] else ()
    cases = [*CASES, *(f"ingot_graph/{v}" for v in ablations)]

    def run(case: str, _: int) -> float:
        python = args.ortgenai_python if case.startswith("ortgenai") else None
        kind, _, variant = case.partition("/")
        job = spec | {"case": kind, "variant": variant, "tmp": str(tmp)}
        return run_worker(WORKER, job, tmp, WORKER_TIMEOUT_S, python)["us_per_token"]

    rounds = interleave(cases, args.rounds, run, after_case=watch.sample)
    base = rounds["ingot_graph"]
    saved = {
        v: [a - b for a, b in zip(base, rounds[f"ingot_graph/{v}"], strict=True)] for v in ablations
    }
    return {
        "us_per_token": {case: statistics.median(v) for case, v in rounds.items()},
        "rounds_us_per_token": rounds,
        "factors": _factors(rounds),
        # µs the ablated part costs: ingot_graph minus the variant, paired per round
        "ablations_us": {v: statistics.median(d) for v, d in saved.items()},
    }


# Each factor: (name, numerator case, denominator case, what it says).
FACTORS = (
    ("whole step", "ortgenai_step", "ingot_step", "ingot's speed / onnxruntime-genai's"),
    ("graph", "ortgenai_graph", "ingot_graph", "ingot's graph / onnxruntime-genai's graph"),
    ("ingot's loop", "ingot_graph", "ingot_step", "graph alone / runtime step"),
    ("onnxruntime-genai's loop", "ortgenai_graph", "ortgenai_step", "graph alone / its step"),
)


def _factors(rounds: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Each factor as the median over rounds of that round's ratio (paired: both cases ran
    minutes apart in the round). whole step = graph x ingot's loop / onnxruntime-genai's loop."""
    out = {}
    for name, num, den, meaning in FACTORS:
        ratio = paired(rounds[num], rounds[den])
        out[name] = {"ratio": ratio.median, "rounds": ratio.rounds, "meaning": meaning}
    return out


def _markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Batch-1 decode: ingot against onnxruntime-genai, graph and loop apart",
        "",
        f"{m['date']} on {m['cpu_model']}, {report['settings']['threads']} threads; "
        f"onnxruntime-genai {report['peer_versions'][ORTGENAI]}. int4 g32, MatMulNBits "
        "accuracy level 4 on both sides (decode.py's weights), 32-token prompt, 127 decode "
        f"steps. {report['settings']['rounds']} rounds; each case in its own process once per "
        "round, the cases in turn; medians. A factor is the median over rounds of that round's "
        "ratio; whole step = graph x ingot's loop / onnxruntime-genai's loop.",
    ]
    for name, model in report["models"].items():
        us = model["us_per_token"]
        lines += [
            "",
            f"## {name}",
            "",
            "| case | µs per token |",
            "|---|---:|",
            *[f"| {case} | {value:.0f} |" for case, value in us.items()],
            "",
            "| factor | ratio | range over rounds | what it is |",
            "|---|---:|---:|---|",
        ]
        for factor, f in model["factors"].items():
            low, high = min(f["rounds"]), max(f["rounds"])
            lines.append(f"| {factor} | {f['ratio']:.2f} | {low:.2f}–{high:.2f} | {f['meaning']} |")
        if model.get("ablations_us"):
            lines += [
                "",
                "Ablations of ingot's graph (ingot_graph/variant: a changed copy over the same "
                "pool and inputs; µs = ingot_graph minus the variant, median of the rounds' "
                "differences): no_attention replaces each Attention by Identity, "
                "no_pool_gather feeds each layer's past K and V from a constant instead of "
                "gathering the pool's blocks, fused_skip_norm fuses each residual Add into the "
                "next RMSNormalization (SkipSimplifiedLayerNormalization, 15 fewer nodes).",
                "",
                "| variant | µs per token it saves |",
                "|---|---:|",
                *[f"| {v} | {d:.0f} |" for v, d in model["ablations_us"].items()],
            ]
    lines += ["", load_line(report["load"], report["refused"]), ""]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ortgenai-python", type=Path, default=peer_python(ORTGENAI))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown} (known: {', '.join(MODELS)})")
    return args


if __name__ == "__main__":
    sys.exit(main())
