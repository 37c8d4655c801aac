"""Speculative decoding in ingot (n-gram, draft model, Medusa heads, EAGLE-3) against plain
decoding, side by side with transformers' assisted generation on the same prompts.

Reproduce (alone on a quiet machine; on 2 cores about 10 minutes before the EAGLE rows, which
add about 2 more (estimated, not yet timed); more the first time, which builds the artifacts
into the benchmark cache, the drafters' training included: about a minute for the Medusa
heads, about 8 for the EAGLE draft (its 800 steps at about 0.5 s each); writes
benchmarks/results/speculative.json and speculative.md):

    .venv/bin/python -m benchmarks.speculative.speculative --wait-idle 1800

Options: [--tokens 128] [--prompt-len 64] [--prompts 16] [--runs 5] [--concurrency 8,32]
[--peer-prompts 16] [--threads 2] [--wait-idle SECONDS] [--models-dir DIR] [--eval-text FILE]
[--calib-text FILE] [--out-dir DIR] [--quick] [--report-only]. `--quick` is a smoke run (32
tokens, 4 prompts, one run, concurrency 4 and 16, 2 peer prompts) written to a temporary
directory, never over the committed results; `--report-only` writes speculative.md again from
speculative.json.

The target is pydoc-16m with the decode benchmark's recipe (decode/artifact.py: RTN int4 g32
symmetric on every linear, lm_head included; ONNX Runtime CPU at level `extended`, int8
activations in the matmuls), plus a `speculative:` section whose draft model is pydoc-tiny
(the same tokenizer), quantized with the target's list. That artifact serves every row but
Medusa's and EAGLE's: the load's `speculative_config` picks the method (False: plain
decoding). An artifact holds one drafter, so the Medusa rows and the EAGLE rows each load a
build of their own (OWN_BUILD) of the same recipe with a `calibration:` section
(`--calib-text`, 128 windows of 512 tokens) and, instead of the draft model, `speculative.method:
medusa`: 4 heads of one residual block, trained in the build (600 steps), or `eagle`: one
EAGLE-3 draft decoder layer reading three of the target's hidden states, trained in the build
(800 steps of 8 spans of 128 tokens, 3 drafting steps unrolled), both by self-distillation
against the quantized target, whose quantize stage comes from the stage cache (the EAGLE
build's target graph also outputs those hidden states: its export and engine are its own).
EAGLE drafts k = 3 tokens a step, not 4: each token is one more draft-layer call after the
previous one, and 3 is what its training unrolls. The drafter stage's (`heads`, `eagle`)
seconds and peak RSS and the manifest's training report (loss; held-out agreement by head,
held-out acceptance by draft position) are reported; a failed build of a drafter fails only its
rows.

Prompts: windows of `--prompt-len` tokens (BOS + text) of the held-out pydoc-eval.txt.
"code": the windows richest in Python code lines (doctest `>>>` / `...` lines, `def`,
`class`, `import`, `return`, `print(`), no two overlapping; "text": evenly spaced windows with
no such line. Every request asks for `--tokens` new tokens, greedy, EOS ignored.

Measured, each engine in its own worker process, the methods' runs interleaved within it
(plain, then every method, per round of `--runs`): tok/s is the median run, a speedup or an
on / off ratio the median of each round's ratio to plain. A timed run during which other
processes took more than OTHERS_LIMIT_CORES (/proc/stat) is repeated (harness.load.OtherWork).

1. batch 1, both prompt sets, every method with the runtime's defaults (adaptive drafting:
   steps with and without drafts are timed, and a batch size drafts only where drafting
   emitted more tokens per second) and n-gram k=4, the draft model, Medusa and EAGLE with
   adaptive drafting off: the prompts one after another through one Generator; decode tok/s (tokens
   after the first over the time after the first: the prefill is TTFT, as in decode.py), the
   speedup over plain, the share of steps that drafted, tokens per target step, ms per step, mean
   accepted length and acceptance by draft position (SpecDecodeStats), and how many prompts'
   tokens equal plain decoding's; for each that differs, plain decoding's top-2 log-probability
   gap where they part (a flipped near-tie, or not);
2. one more batch-1 run of the code prompts with the engine calls timed: per decode step, the
   target's call (by tokens per sequence), the drafter (its engines' calls apart: the draft
   engine's, the Medusa heads', the EAGLE draft layer's and fc's) and the rest of the runtime,
   which says how much of the step is fixed per-call cost;
3. `--concurrency` code prompts submitted at once to one Generator: generated tokens over the
   wall time, speculation on (default thresholds: no drafting in a step with more than
   disable_by_batch_size = 8 decoding requests) against off, and "forced" (every step drafts,
   at any batch size) above that threshold, which shows what the threshold saves; plain
   decoding's outputs there against the same prompts' alone (the control for = plain);
4. transformers (torch CPU, `--threads` threads, pydoc-16m in fp32): plain `generate`,
   `assistant_model=pydoc-tiny` (transformers' defaults: up to 20 draft tokens, stopped early
   below 0.4 confidence; and 4 tokens, as ingot drafts), and `prompt_lookup_num_tokens=4`, on
   the first `--peer-prompts` prompts of each set, one run each after a warm-up; a streamer
   timestamps the tokens, so tok/s is decode-only as for ingot (transformers has no Medusa or
   EAGLE decoding: the Medusa and EAGLE rows have no counterpart there);
5. the host's 1-min load, every 10 s during each case and between cases (harness.load.LoadWatch):
   a run whose load exceeded the thread count + 1 is written with a REFUSED line at the top
   and exits 1.

The worker of one case is worker.py (ingot's methods: ingot_runs.py, breakdown.py,
compare.py; transformers: peer.py); the report is report.py (sections.py, figures.py); what
runs is methods.py, the prompts prompts.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import OPENVINO, DecodeArtifact, build_spec
from benchmarks.decode.artifact import WORKER as BUILD_WORKER
from benchmarks.decode.models import prepare_model
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, wait_idle
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, rerender
from benchmarks.speculative.methods import (
    CALIBRATION,
    DRAFT,
    DRAFT_TOKENS,
    FORCED,
    KV_CACHE_BYTES,
    METHODS,
    NGRAM_LOOKUP,
    OWN_BUILD,
    PEER_CASES,
    TARGET,
    ingot_methods,
)
from benchmarks.speculative.prompts import prompt_summary, select_prompts
from benchmarks.speculative.report import STEM, markdown, publish_report, report_stem

WORKER = "benchmarks.speculative.worker"
DEFAULT_THREADS = 2  # what the committed results ran with (a 2-core host)
WORKER_TIMEOUT_S = 1800
LOAD_SAMPLE_S = 10  # the host's load is sampled this often during each case
# What each --engine runs (decode/artifact.py's targets).
ENGINE_SETTINGS = {
    "onnxruntime": "onnxruntime cpu, level extended, MatMulNBits accuracy level 4",
    OPENVINO: "openvino cpu (ingot's OpenVINO engine: PagedAttention over the pool), f32 "
    "inference precision, int8 dynamic quantization of the int4 matmuls' activations, KV blocks "
    "of 32",
}
QUICK = dict(tokens=32, prompts=4, runs=1, concurrency=[4, 16], peer_prompts=2)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, report_stem(args.engine), markdown)
    idle_wait_s = wait_idle(args.wait_idle, _log, poll_s=60)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    machine = machine_info() | {"waited_for_idle_s": idle_wait_s, "code": _code_state()}
    prompts = select_prompts(
        args.models_dir / TARGET, args.eval_text, args.prompt_len, args.prompts, args.concurrency
    )
    results: dict[str, Any] = {"prompts": prompt_summary(prompts, args)}
    with tempfile.TemporaryDirectory(prefix="ingot-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        artifacts, results["build"] = _build(args, tmp, watch)
        if artifacts["target"] is None:
            results["ingot"] = {"ok": False, "error": "no artifact could be built"}
        else:
            _log("ingot: batch 1 and concurrent requests")
            results["ingot"] = _worker(_ingot_spec(args, artifacts, prompts), tmp, watch)
        watch.sample()
        _log("transformers: plain, assisted generation, prompt lookup")
        results["transformers"] = _worker(_peer_spec(args, prompts), tmp, watch)
        watch.sample()
    refused = watch.refusal()
    report = _report(machine, results, args, watch, refused)
    report["wall_s"] = time.perf_counter() - started
    _log(f"done in {report['wall_s']:.0f} s")
    return publish_report(report, args.out_dir, report_stem(args.engine))


# ----------------------------------------------------------------------------- the cases


def _build(
    args: argparse.Namespace, tmp: Path, watch: LoadWatch
) -> tuple[dict[str, str | None], dict[str, Any]]:
    """The artifacts, {"target": ..., "medusa": ..., "eagle": ...} (None: not built), and the
    builds' record. "target": the target with the draft built in; without the draft if that
    build fails (then the draft_model rows report the failure). Each OWN_BUILD method: the same
    target with its drafter trained in the build (an artifact holds one drafter); its quantized
    target comes from the stage cache, and when it fails only that method's rows do."""
    model = prepare_model(TARGET, args.models_dir, args.eval_text)
    plain_spec = build_spec(model, tmp, args.threads, interop=[], shape=_shape(args))
    draft = {
        "method": "draft_model",
        "num_speculative_tokens": DRAFT_TOKENS,
        "draft": {"source": {"path": str(args.models_dir / DRAFT)}},
    }
    spec, recipe = _variant(plain_spec, f"draft-{DRAFT}", {"speculative": draft})
    builds: dict[str, Any] = {"recipe": recipe}
    artifacts: dict[str, str | None] = {"target": None, **dict.fromkeys(OWN_BUILD)}
    for name, build in (("with_draft", spec), ("without_draft", plain_spec)):
        builds[name] = _build_one(name.replace("_", " "), build, tmp, watch)
        if builds[name].get("ok"):
            builds["draft_built"] = name == "with_draft"
            artifacts["target"] = builds[name]["artifact"]
            break
    if artifacts["target"] is None:  # nothing to run: no second build of a failing target
        return artifacts, builds
    for method, own in OWN_BUILD.items():
        sections = _own_build_sections(args, method)
        spec, builds[f"{method}_recipe"] = _variant(plain_spec, method, sections)
        built = builds[method] = _build_one(f"with the {own.title}", spec, tmp, watch)
        if built.get("ok"):
            artifacts[method] = built["artifact"]
            built["drafter"] = _drafter_record(method, built)
    return artifacts, builds


def _shape(args: argparse.Namespace) -> DecodeArtifact:
    """The artifact's shape: the decode benchmarks' defaults, or with --engine openvino their
    OpenVINO variant (its target beside ONNX Runtime's, and the 32-token blocks its CPU plugin
    runs, so the draft model and the drafters' graphs share that pool)."""
    return (
        DecodeArtifact(block_size=32, openvino=True)
        if args.engine == OPENVINO
        else DecodeArtifact()
    )


def _variant(
    spec: dict[str, Any], suffix: str, sections: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of the build spec (and its recipe) whose recipe adds `sections`, under a name and
    an output directory of its own; the stages it shares with the spec's come from the cache."""
    recipe = json.loads(Path(spec["recipe"]).read_text()) | sections
    recipe["artifact"]["name"] += f"-{suffix}"
    path = Path(spec["recipe"])
    path = path.with_name(f"{path.stem}-{suffix}{path.suffix}")
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML: the recipe loader reads it
    return spec | {"recipe": str(path), "out": f"{spec['out']}-{suffix}"}, recipe


def _own_build_sections(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """The recipe sections an OWN_BUILD method's build adds: its drafter, trained in the build
    on the calibration windows (every such method on the same ones)."""
    own = OWN_BUILD[method]
    return {
        "calibration": {"dataset": str(args.calib_text), **CALIBRATION},
        "speculative": {
            "method": method,
            "num_speculative_tokens": own.tokens,
            "heads": {"train": own.train},
        },
    }


def _build_one(name: str, spec: dict[str, Any], tmp: Path, watch: LoadWatch) -> dict[str, Any]:
    """One build in a worker (decode/engines.py): the artifact and every stage's StageRun."""
    _log(f"building the artifact ({name})")
    built = _worker(spec, tmp, watch, BUILD_WORKER)
    watch.sample()
    return built


def _drafter_record(method: str, built: dict[str, Any]) -> dict[str, Any]:
    """An OWN_BUILD method's build: the stage that trained its drafter (a cache hit took no
    training: its seconds and peak are the hit's) and the manifest's record of the drafter
    (speculative.heads, speculative.eagle; its graphs' check left out), whose training report
    the artifact keeps; an unreadable manifest is recorded, and the method's rows' loads then
    say what is wrong."""
    # ingot.artifacts only once a drafter was built: --help and --report-only need none of it.
    from ingot.artifacts import read_manifest

    name = OWN_BUILD[method].stage
    stage = next((s for s in built.get("stages", []) if s["stage"] == name), None)
    try:
        info = getattr(read_manifest(Path(built["artifact"])).speculative, name)
        return {"stage": stage, **info.model_dump(mode="json", exclude={"check"})}
    except Exception as e:  # the other rows go on
        return {"stage": stage, "error": f"{type(e).__name__}: {e}"}


def _ingot_spec(
    args: argparse.Namespace, artifacts: dict[str, str | None], prompts: dict[str, Any]
) -> dict:
    methods = ingot_methods()
    return {
        "kind": "ingot",
        "artifact": artifacts["target"],
        # The rows of an OWN_BUILD method load that build (None: it failed); the rest, "artifact".
        "artifacts": {
            name: artifacts[config["method"]]
            for name, config in methods.items()
            if config and config["method"] in OWN_BUILD
        },
        "methods": methods,
        "concurrent_methods": [name for name, _ in METHODS],
        "forced": FORCED,
        "tokens": args.tokens,
        "runs": args.runs,
        "batch1": {name: [w["ids"] for w in ws[: args.prompts]] for name, ws in prompts.items()},
        "concurrent": {str(n): [w["ids"] for w in prompts["code"][:n]] for n in args.concurrency},
        "kv_cache_bytes": KV_CACHE_BYTES,
        "engine": args.engine,
    }


def _peer_spec(args: argparse.Namespace, prompts: dict[str, Any]) -> dict:
    return {
        "kind": "transformers",
        "target": str(args.models_dir / TARGET),
        "draft": str(args.models_dir / DRAFT),
        "threads": args.threads,
        "tokens": args.tokens,
        "cases": [list(c) for c in PEER_CASES],
        "prompts": {
            name: [w["ids"] for w in ws[: min(args.prompts, args.peer_prompts)]]
            for name, ws in prompts.items()
        },
    }


def _worker(
    spec: dict[str, Any], tmp: Path, watch: LoadWatch, module: str = WORKER
) -> dict[str, Any]:
    """One case in a fresh process (worker.py); a crash or timeout becomes an error record.
    The load is sampled every LOAD_SAMPLE_S while it runs: other work that starts during a
    case is caught, not only work still running between cases."""
    started = time.perf_counter()
    try:
        with watch.sampling(LOAD_SAMPLE_S):
            result = run_worker(module, spec, tmp, WORKER_TIMEOUT_S)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}
    result["wall_s"] = time.perf_counter() - started
    return result


def _report(
    machine: dict,
    results: dict,
    args: argparse.Namespace,
    watch: LoadWatch,
    refused: str | None,
) -> dict[str, Any]:
    return {
        "benchmark": "speculative",
        "refused": refused,
        "settings": {
            "target": TARGET,
            "draft": DRAFT,
            "weights": "RTN int4 g32 symmetric, lm_head included (target and draft)",
            "engine": ENGINE_SETTINGS[args.engine],
            "engine_kind": args.engine,
            "greedy": True,
            "ignore_eos": True,
            "new_tokens": args.tokens,
            "prompt_tokens": args.prompt_len,
            "batch1_prompts": args.prompts,
            "peer_prompts": min(args.prompts, args.peer_prompts),
            "concurrency": args.concurrency,
            "runs": args.runs,
            "statistic": "median",
            "threads": args.threads,
            "methods": ingot_methods(),
            "forced": FORCED,
            "ngram_lookup": NGRAM_LOOKUP,
            **{m: {"train": own.train, "calibration": CALIBRATION} for m, own in OWN_BUILD.items()},
            "kv_cache_bytes": KV_CACHE_BYTES,
            "eval_text": str(args.eval_text),
            "calib_text": str(args.calib_text),
            "quick": args.quick,
        },
        "machine": machine,
        "host_load": watch.record(),
        "results": results,
    }


def _code_state() -> dict[str, Any]:
    """The commit benchmarked, and whether the runtime or the build had uncommitted edits."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "runtime", "pipeline", "artifacts", "ingot")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}


def _log(message: str) -> None:
    print(f"[speculative] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (BOS too)")
    parser.add_argument("--prompts", type=int, default=16, help="batch-1 prompts per set")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument(
        "--concurrency", default="8,32", help="comma-separated numbers of concurrent requests"
    )
    parser.add_argument(
        "--peer-prompts", type=int, default=16, help="prompts per set through transformers"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="intra-op threads of the engine and of torch (default: %(default)s)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="first wait up to this long for the 1-min load average to drop below 1",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=models_dir(),
        metavar="DIR",
        help=f"directory holding {TARGET} and {DRAFT} (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        metavar="FILE",
        help="held-out text the prompts come from (default: %(default)s)",
    )
    parser.add_argument(
        "--calib-text",
        type=Path,
        default=data_dir() / "pydoc-calib.txt",
        metavar="FILE",
        help="text the Medusa heads and the EAGLE draft are trained on (the calibration "
        "windows; default: %(default)s)",
    )
    parser.add_argument("--out-dir", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 32 tokens, 4 prompts, 1 run, concurrency 4,16; to a temp dir",
    )
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINE_SETTINGS),
        default="onnxruntime",
        help="the engine every ingot row runs on (default: %(default)s); openvino writes "
        f"{STEM}_openvino.json / .md beside the ONNX Runtime report",
    )
    add_report_only(parser)
    args = parser.parse_args(argv)
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "ingot-speculative-quick"
        args.out_dir = quick_dir if args.quick else RESULTS
    return args


if __name__ == "__main__":
    sys.exit(main())
