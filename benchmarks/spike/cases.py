"""The spike's timed cases, shared by its routes (openvino.py, llamacpp.py): each part's prompts,
and one case run as interleaved rounds of decode jobs, each engine in its own process.

Parts: `batch1` (one 32-token prompt, 128 new tokens), `batched` (32 prompts of 32 tokens, 64
new tokens each, decoding together), `long` (one prompt of 4096 - 128 tokens, 128 new: decode
at ~4k of context and its TTFT; a model with a shorter context, pydoc-16m's 1024, gets its own
maximum). A round runs every engine once (load, warm-up, one timed run), in turn, the order
rotated (harness.rounds.interleave); the case keeps medians over rounds and the ratios to
ingot's engine paired within a round (openvino_report.pair_with_ingot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.decode.models import PROMPT_LEN, BenchModel, prepare_model
from benchmarks.decode.rounds import merge_rounds
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.rounds import interleave
from benchmarks.spike.openvino_report import pair_with_ingot

__all__ = [
    "CASES",
    "previous_report",
    "LONG_CONTEXT",
    "TIMEOUT_S",
    "WARMUP_TOKENS",
    "Job",
    "case_prompts",
    "decode_spec",
    "measure_parts",
    "run_case",
    "run_job",
]

CASES = {  # part -> (sequences, prompt tokens or None for the long one, new tokens)
    "batch1": (1, PROMPT_LEN, 128),
    "batched": (32, PROMPT_LEN, 64),
    "long": (1, None, 128),
}
LONG_CONTEXT = 4096
WARMUP_TOKENS = 4
TIMEOUT_S = 1800

# One round of one engine: (engine name, prompts, new tokens, context per sequence) -> result.
Job = Callable[[str, list[list[int]], int, int], dict[str, Any]]


def measure_parts(
    report: dict[str, Any],
    args: argparse.Namespace,
    interop: Sequence[str],
    check: Callable[[BenchModel, str, Path], dict[str, Any]],
    case: Callable[[BenchModel, str, str, Path, LoadWatch], dict[str, Any]],
) -> None:
    """Every part of every model in `args` (models, parts, threads, models_dir, eval_text)
    into `report["models"]`, on the spike's artifact with the `interop` formats: `check(model,
    artifact, tmp)` for the untimed `check` part, `case(model, artifact, part, tmp, watch)`
    for the timed ones. Each part keeps its own load record and verdict; the report's `load`
    and `refused` cover every part's, this run's and those kept from earlier runs."""
    from benchmarks.spike.ov_artifacts import build_artifact

    watch = LoadWatch(args.threads)
    models = report.setdefault("models", {})
    with tempfile.TemporaryDirectory(prefix="spike-") as tmp:
        for name in args.models:
            # Absolute: the build reads the model from a recipe written elsewhere.
            model = prepare_model(name, args.models_dir.resolve(), args.eval_text.resolve())
            entry = models.setdefault(name, {})
            _log(f"{name}: building the artifact")
            built = build_artifact(model, Path(tmp), args.threads, interop)
            entry["artifact"] = {k: built.get(k) for k in ("ok", "artifact", "error", "seconds")}
            if not built.get("ok"):
                continue
            for part in args.parts:
                _log(f"{name}: {part}")
                case_watch = LoadWatch(args.threads, timed=part != "check")  # untimed
                if part == "check":
                    entry["check"] = check(model, built["artifact"], Path(tmp))
                else:
                    record = case(model, built["artifact"], part, Path(tmp), case_watch)
                    entry.setdefault("cases", {})[part] = record
                case_watch.sample()
                entry.setdefault("loads", {})[part] = case_watch.record()
                entry.setdefault("refused", {})[part] = case_watch.refusal()
                watch.samples += case_watch.samples
    samples = [
        v
        for e in models.values()
        for r in e.get("loads", {}).values()
        for v in r["load_1min_samples"]
    ]
    report["load"] = watch.record() | {"load_1min_samples": samples or watch.samples}
    refused = [
        f"{m}/{p}: {why}"
        for m, e in models.items()
        for p, why in e.get("refused", {}).items()
        if why
    ]
    report["refused"] = "; ".join(refused) or None


def case_prompts(model: BenchModel, artifact: str, part: str) -> list[list[int]]:
    """The part's prompts for `model` (the long one sized by the artifact's max_seq_len)."""
    sequences, prompt_len, tokens = CASES[part]
    if prompt_len is None:
        manifest = json.loads((Path(artifact) / "manifest.json").read_text())
        context = min(LONG_CONTEXT, manifest["model"]["max_seq_len"])
        return [model.prompts(1, context - tokens)[0]]
    if sequences == 1:
        return [list(model.prompt_ids)]
    return model.prompts(sequences, prompt_len)


def run_case(
    model: BenchModel, artifact: str, part: str, engines: list[str], rounds: int, job: Job
) -> dict[str, Any]:
    """The part's case: `rounds` interleaved rounds of `job` per engine, merged and paired."""
    prompts = case_prompts(model, artifact, part)
    tokens = CASES[part][2]
    ctx = max(map(len, prompts)) + tokens + 1

    def run(engine: str, _: int) -> dict[str, Any]:
        result = job(engine, prompts, tokens, ctx)
        _log(f"  {engine}: {result.get('tokens_per_s') or result.get('error')}")
        return result

    merged = {name: merge_rounds(r) for name, r in interleave(engines, rounds, run).items()}
    pair_with_ingot(merged)
    prompt_lens = sorted({len(p) for p in prompts})
    return {"sequences": len(prompts), "prompt_tokens": prompt_lens, "new_tokens": tokens} | {
        "engines": merged
    }


def decode_spec(engine: str, load: dict[str, Any], prompts: list[list[int]], tokens: int) -> dict:
    """A decode worker's spec (benchmarks/decode/engines.py's `decode` kind): one timed run
    after a warm-up, within the spike's time budget."""
    return {
        "kind": "decode",
        "engine": engine,
        "load": load,
        "prompts": prompts,
        "tokens": tokens,
        "warmup_tokens": WARMUP_TOKENS,
        "runs": 1,
        "budget_s": TIMEOUT_S,
        "reduced_budget_s": TIMEOUT_S / 2,
    }


def run_job(worker: str, spec: dict, tmp: Path, python: Path | None) -> dict[str, Any]:
    """`worker` on `spec` in a fresh process (`python`, else this interpreter), its wall time
    and the host load after it added; a crash or timeout becomes a failed result."""
    started = time.perf_counter()
    try:
        result = run_worker(worker, spec, tmp, TIMEOUT_S, python)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}
    result["wall_s"] = time.perf_counter() - started
    result["load_1min_after"] = os.getloadavg()[0]
    return result


def _log(message: str) -> None:
    print(f"[spike] {message}", file=sys.stderr, flush=True)


def previous_report(out_dir: Path, stem: str, engines: dict[str, Any]) -> dict[str, Any]:
    """The report so far (each run replaces the parts it measured and keeps the others), with
    this run's settings: the cases, the warm-up and the route's `engines`."""
    path = out_dir / f"{stem}.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.pop("command", None)
    report["benchmark"] = stem
    report["settings"] = {
        "long_context": LONG_CONTEXT,
        "warmup_tokens": WARMUP_TOKENS,
        "cases": {k: list(v) for k, v in CASES.items()},
        "engines": engines,
    }
    return report
