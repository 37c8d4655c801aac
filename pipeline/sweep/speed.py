"""Speed of built artifacts, each timed alone in a fresh interpreter (speed_worker.py): batch-1
decode tok/s, total output tok/s of `concurrency` requests at once and their TTFT p50.

Rounds are interleaved across variants (round r runs every variant once, the order rotated by
r), so a slow spell of the host falls on all of them, and each figure is the median over the
rounds. Prompts are token ids drawn from the artifact's own vocabulary with a fixed seed (the
same for every variant of one model), greedy, EOS ignored. The quiet-host rule
(ingot.common.host_load): the load is sampled before, between and after the runs and recorded
in `SpeedReport.load`; a loaded run is reported as such (`quiet: false`), or refused with
`refuse_loaded`. Before the first round the rule waits (at most SETTLE_MAX_S) for the load to
come down to the thread count: builds just before leave their own load in the 1-minute average.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingot.artifacts import read_manifest
from ingot.common.errors import IngotError
from ingot.common.host_load import LoadWatch

__all__ = ["SpeedError", "SpeedReport", "SpeedResult", "measure_speed", "rotated"]

SETTLE_MAX_S = 60.0  # the longest wait for the host's load to come down before timing
_SETTLE_POLL_S = 5  # the kernel recomputes the load average every 5 s
_WORKER_TIMEOUT_S = 900
_SEED = 0
_MODULE = "ingot.pipeline.sweep.speed_worker"


@dataclass(frozen=True)
class SpeedResult:
    tok_s_batch1: float  # decode tok/s, one request, median over rounds
    tok_s_batch32: float  # total output tok/s, 32 requests at once (in-process Generator)
    ttft_ms_p50: float  # TTFT p50 of the 32-request burst, median over rounds


@dataclass(frozen=True)
class SpeedReport:
    results: dict[str, SpeedResult]  # by variant name
    load: dict  # the host load record (before/after, threads, quiet: bool)


class SpeedError(IngotError, RuntimeError):
    """A speed measurement that cannot run (bad lengths, a loaded host when refused, a worker
    that failed); the message names the variant or the load."""


def measure_speed(
    artifacts: Mapping[str, Path],
    *,
    rounds: int = 3,
    prompt_tokens: int = 64,
    output_tokens: int = 32,
    concurrency: int = 32,
    refuse_loaded: bool = False,
) -> SpeedReport:
    """Time every artifact (see the module); `refuse_loaded` raises a one-line SpeedError when
    the host is loaded, otherwise a loaded run is reported in `load["quiet"]`."""
    _check_lengths(artifacts, rounds, prompt_tokens, output_tokens, concurrency)
    threads = len(os.sched_getaffinity(0))  # the engines use every core they may
    _settle(threads)
    watch = LoadWatch(threads)
    if refuse_loaded and (reason := watch.refusal()) is not None:
        raise SpeedError(f"speed measurement refused before it started: {reason}")
    spec = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "seed": _SEED}
    spec["concurrency"] = concurrency
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in artifacts}
    for r in range(rounds):
        for name in rotated(list(artifacts), r):
            runs[name].append(_run_worker(name, {**spec, "artifact": str(artifacts[name])}))
            watch.sample()
    reason = watch.refusal()
    if refuse_loaded and reason is not None:
        raise SpeedError(f"speed measurement refused: {reason}")
    return SpeedReport({name: _median(r) for name, r in runs.items()}, _load(watch, reason))


def rotated(names: list[str], r: int) -> list[str]:
    """Round r's order: the variants rotated by r."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def _check_lengths(
    artifacts: Mapping[str, Path], rounds: int, prompt: int, output: int, concurrency: int
) -> None:
    counts = {"rounds": rounds, "prompt_tokens": prompt, "concurrency": concurrency}
    for what, value in counts.items():
        if value < 1:
            raise SpeedError(f"speed measurement: {what} must be >= 1, not {value}")
    if output < 2:  # decode speed is measured between the first and the last token
        raise SpeedError(f"speed measurement: output_tokens must be >= 2, not {output}")
    for name, artifact in artifacts.items():
        longest = read_manifest(Path(artifact)).model.max_seq_len
        if prompt + output > longest:
            raise SpeedError(
                f"speed measurement of {name}: prompt_tokens + output_tokens = "
                f"{prompt + output} exceeds the artifact's max_seq_len {longest}"
            )


def _settle(threads: int) -> None:
    """Wait (at most SETTLE_MAX_S) until the 1-minute load is down to the thread count."""
    deadline = time.monotonic() + SETTLE_MAX_S
    while os.getloadavg()[0] > threads and time.monotonic() < deadline:
        time.sleep(min(_SETTLE_POLL_S, max(0.0, deadline - time.monotonic())))


def _run_worker(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"ingot-speed-{name}-") as tmp:
        spec_file, result_file = Path(tmp, "spec.json"), Path(tmp, "result.json")
        spec_file.write_text(json.dumps(spec))
        argv = [sys.executable, "-m", _MODULE, str(spec_file), str(result_file)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SpeedError(f"speed of {name}: no result in {_WORKER_TIMEOUT_S} s") from None
        if not result_file.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpeedError(f"speed of {name}: worker exited {done.returncode}: {tail}")
        result = json.loads(result_file.read_text())
    if not result["ok"]:
        raise SpeedError(f"speed of {name}: {result['error']}")
    return result


def _median(runs: list[dict[str, Any]]) -> SpeedResult:
    return SpeedResult(
        statistics.median(r["tok_s_batch1"] for r in runs),
        statistics.median(r["tok_s_burst"] for r in runs),
        statistics.median(r["ttft_ms_p50"] for r in runs),
    )


def _load(watch: LoadWatch, loaded: str | None) -> dict[str, Any]:
    """The report's load record: the rule's samples and verdict (`loaded`: why the numbers
    are not valid, None on a quiet host)."""
    samples = watch.record()["load_1min_samples"]
    return {
        "before": samples[0],
        "after": samples[-1],
        "max": max(samples),
        "samples": samples,
        "threads": watch.threads,
        "quiet": loaded is None,
        "loaded": loaded,
    }
