"""Speculative decoding in ingot (n-gram, draft model, Medusa heads, EAGLE-3) against plain
decoding, side by side with transformers' assisted generation on the same prompts.

Reproduce (alone on a quiet machine; on 2 cores about 10 minutes before the EAGLE rows, which
add about 2 more (estimated, not yet timed); more the first time, which builds the artifacts
into the benchmark cache, the drafters' training included: about a minute for the Medusa
heads, about 8 for the EAGLE draft (its 800 steps at about 0.5 s each); writes
benchmarks/results/speculative.json and speculative.md):

    .venv/bin/python benchmarks/speculative.py --wait-idle 1800

Options: [--tokens 128] [--prompt-len 64] [--prompts 16] [--runs 5] [--concurrency 8,32]
[--peer-prompts 16] [--threads 2] [--wait-idle SECONDS] [--models-dir DIR] [--eval-text FILE]
[--calib-text FILE] [--out-dir DIR] [--quick]. `--quick` is a smoke run (32 tokens, 4 prompts,
one run, concurrency 4 and 16, 2 peer prompts) written to a temporary directory, never over the
committed results.

The target is pydoc-16m with the decode benchmark's recipe (ort_artifacts.py: RTN int4 g32
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
processes took more than OTHERS_LIMIT_CORES (/proc/stat) is repeated (class Quiet).

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
5. the host's 1-min load, every 10 s during each case and between cases (machine.LoadWatch):
   a run whose load exceeded the thread count + 1 is written with a REFUSED line at the top
   and exits 1.

Run as `speculative.py SPEC.json RESULT.json` it is the worker of one case (worker.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sibling helper modules; benchmarks/ is not a package

from machine import LoadWatch, machine_info, memory_status, wait_idle  # noqa: E402
from paths import REPO, data_dir, models_dir, write_report_files  # noqa: E402

DEFAULT_THREADS = 2  # what the committed results ran with (a 2-core host)
TARGET, DRAFT = "pydoc-16m", "pydoc-tiny"
DRAFT_TOKENS = 4  # the draft model's num_speculative_tokens (the recipe's default)
MEDUSA_TOKENS = 4  # Medusa's num_speculative_tokens: one token from each head
# EAGLE's num_speculative_tokens, EAGLE-3's usual k (recipes/demo-eagle.yaml's too), and the
# drafting steps its training unrolls (ttt_steps): every draft position is one the draft learned
# to draft from its own output. Fewer than Medusa's 4: each EAGLE token is one more draft-layer
# call after the previous one (Medusa's 4 come from one call), for a position accepted only
# after every earlier one.
EAGLE_TOKENS = 3
# Methods: (name, speculative_config for LoadedModel.load). The draft model is built into the
# target's artifact, the Medusa heads and the EAGLE draft into one of their own each; ngram
# needs nothing built.
METHODS: tuple[tuple[str, dict[str, Any] | bool], ...] = (
    ("plain", False),
    ("ngram k=2", {"method": "ngram", "num_speculative_tokens": 2}),
    ("ngram k=4", {"method": "ngram", "num_speculative_tokens": 4}),
    ("draft_model k=4", {"method": "draft_model", "num_speculative_tokens": DRAFT_TOKENS}),
    ("medusa k=4", {"method": "medusa", "num_speculative_tokens": MEDUSA_TOKENS}),
    ("eagle k=3", {"method": "eagle", "num_speculative_tokens": EAGLE_TOKENS}),
)
NGRAM_LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 4}
# The trained drafters' builds add the calibration windows they learn on.
CALIBRATION = {"samples": 128, "seq_len": 512}
MEDUSA_TRAIN = {
    "num_heads": MEDUSA_TOKENS,
    "num_layers": 1,
    "steps": 600,
    "learning_rate": 0.001,
    "batch_size": 64,
    "seed": 0,
}
EAGLE_TRAIN = {
    "steps": 800,
    "learning_rate": 0.001,
    "batch_size": 8,
    "span": 128,
    "ttt_steps": EAGLE_TOKENS,
    "seed": 0,
}


class OwnBuild(NamedTuple):
    """A method whose drafter is trained in a build of its own."""

    tokens: int  # num_speculative_tokens
    train: dict[str, Any]  # speculative.heads.train
    stage: str  # the build stage that trains it, also its field of the manifest's speculative
    title: str  # what the report calls it


# An artifact holds one drafter: these methods load their own build of the target (_build).
OWN_BUILD = {
    "medusa": OwnBuild(MEDUSA_TOKENS, MEDUSA_TRAIN, "heads", "Medusa heads"),
    "eagle": OwnBuild(EAGLE_TOKENS, EAGLE_TRAIN, "eagle", "EAGLE-3 draft"),
}
# Batch 1 only: these methods with the runtime's adaptive drafting off (drafting every step
# it can, however its steps time), which shows what speculation itself costs and gains.
ADAPTIVE_OFF = ("ngram k=4", "draft_model k=4", "medusa k=4", "eagle k=3")
# The "forced" variants above the batch-size threshold: drafting at any batch size, adaptive
# off, so every step of every request drafts.
FORCED = {"disable_by_batch_size": 1024, "adaptive": False}
KV_CACHE_BYTES = 128 << 20  # every case fits (32 x 208 tokens at 12 KiB, target and draft)
# transformers' assisted generation: (name, GenerationConfig fields, uses the assistant).
PEER_CASES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("plain", {}, False),
    ("assistant_model (defaults)", {}, True),
    (
        "assistant_model k=4",
        {
            "num_assistant_tokens": DRAFT_TOKENS,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        True,
    ),
    ("prompt_lookup_num_tokens=4", {"prompt_lookup_num_tokens": 4}, False),
)
# Python code lines of the reStructuredText: doctest lines and statements at a line's start.
CODE_LINE = re.compile(
    r"^\s*(>>>|\.\.\.(\s|$)|def |class |import |from \S+ import |return |print\()", re.M
)
NEAR_TIE = 0.1  # top-2 log-probability gap below which rounding may flip greedy's choice
MIN_CODE_LINES = 2  # a "code" window holds at least this many
WORKER_TIMEOUT_S = 1800
# A timed run during which other processes (or the hypervisor: steal) used more than this many
# cores is repeated, up to MAX_ATTEMPTS times in all: a few seconds of someone else's work
# barely moves the 1-min load but spoils a run of one method (and so its ratio to plain).
OTHERS_LIMIT_CORES = 0.25
MAX_ATTEMPTS = 4
LOAD_SAMPLE_S = 10  # the host's load is sampled this often during each case
QUICK = dict(tokens=32, prompts=4, runs=1, concurrency=[4, 16], peer_prompts=2)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    idle_wait_s = wait_idle(args.wait_idle, _log, poll_s=60)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    machine = machine_info() | {"waited_for_idle_s": idle_wait_s, "code": _code_state()}
    prompts = select_prompts(
        args.models_dir / TARGET, args.eval_text, args.prompt_len, args.prompts, args.concurrency
    )
    results: dict[str, Any] = {"prompts": _prompt_summary(prompts, args)}
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
    json_path, md_path = write_reports(report, args.out_dir)
    _log(f"wrote {json_path} and {md_path} ({report['wall_s']:.0f} s)")
    print(md_path.read_text())
    if refused:
        _log(f"REFUSED: {refused}")
        return 1
    return 0


# ----------------------------------------------------------------------------- prompts


def select_prompts(
    model_dir: Path, eval_text: Path, length: int, count: int, concurrency: list[int]
) -> dict[str, Any]:
    """The "code" windows (the most code lines first, at least as many as the largest
    concurrency) and the "text" windows (no code line, evenly spaced), as token ids, BOS first;
    each with its offset in the text's tokens and its number of code lines."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = json.loads((model_dir / "config.json").read_text())["bos_token_id"]
    text = eval_text.read_text()
    encoded = tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = encoded.ids, encoded.offsets
    body = length - 1
    stride = 8  # candidate windows start every `stride` tokens
    candidates = []
    for start in range(0, len(ids) - body, stride):
        window = text[offsets[start][0] : offsets[start + body - 1][1]]
        candidates.append((len(CODE_LINE.findall(window)), start))
    need = max(count, *concurrency)
    code: list[tuple[int, int]] = []
    for lines, start in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if lines < MIN_CODE_LINES or len(code) == need:
            break
        if all(abs(start - s) >= body for _, s in code):
            code.append((lines, start))
    if len(code) < need:
        raise ValueError(
            f"{eval_text} has {len(code)} non-overlapping windows of {body} tokens with "
            f">= {MIN_CODE_LINES} code lines; {need} are needed"
        )
    plain = [(0, s) for lines, s in candidates if lines == 0 and s % body == 0]
    step = len(plain) / count
    prose = [plain[int(i * step)] for i in range(count)]

    def windows(chosen: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{"offset": s, "code_lines": n, "ids": [bos, *ids[s : s + body]]} for n, s in chosen]

    return {"code": windows(code), "text": windows(prose)}


def _prompt_summary(prompts: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
        name: {
            "windows": len(windows),
            "batch1_prompts": min(args.prompts, len(windows)),
            "token_offsets": [w["offset"] for w in windows],
            "code_lines": [w["code_lines"] for w in windows],
        }
        for name, windows in prompts.items()
    }


# ----------------------------------------------------------------------------- the cases


def _build(
    args: argparse.Namespace, tmp: Path, watch: LoadWatch
) -> tuple[dict[str, str | None], dict[str, Any]]:
    """The artifacts, {"target": ..., "medusa": ..., "eagle": ...} (None: not built), and the
    builds' record. "target": the target with the draft built in; without the draft if that
    build fails (then the draft_model rows report the failure). Each OWN_BUILD method: the same
    target with its drafter trained in the build (an artifact holds one drafter); its quantized
    target comes from the stage cache, and when it fails only that method's rows do."""
    from bench_models import prepare_model
    from ort_artifacts import build_spec

    model = prepare_model(TARGET, args.models_dir, args.eval_text)
    plain_spec = build_spec(model, tmp, args.threads, interop=[])
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
    """One build in a worker (decode_engines.py): the artifact and every stage's StageRun."""
    _log(f"building the artifact ({name})")
    built = _worker(spec, tmp, watch, HERE / "decode_engines.py")
    watch.sample()
    return built


def _drafter_record(method: str, built: dict[str, Any]) -> dict[str, Any]:
    """An OWN_BUILD method's build: the stage that trained its drafter (a cache hit took no
    training: its seconds and peak are the hit's) and the manifest's record of the drafter
    (speculative.heads, speculative.eagle; its graphs' check left out), whose training report
    the artifact keeps; an unreadable manifest is recorded, and the method's rows' loads then
    say what is wrong."""
    from ingot.artifacts import read_manifest

    name = OWN_BUILD[method].stage
    stage = next((s for s in built.get("stages", []) if s["stage"] == name), None)
    try:
        info = getattr(read_manifest(Path(built["artifact"])).speculative, name)
        return {"stage": stage, **info.model_dump(mode="json", exclude={"check"})}
    except Exception as e:  # the other rows go on
        return {"stage": stage, "error": f"{type(e).__name__}: {e}"}


def ingot_methods() -> dict[str, dict[str, Any] | bool]:
    """Every row's speculative_config: METHODS, then the ADAPTIVE_OFF variants."""
    methods = dict(METHODS)
    for name, config in METHODS:
        if config and config["method"] == "ngram":
            methods[name] = config | NGRAM_LOOKUP
    for name in ADAPTIVE_OFF:
        methods[f"{name} adaptive off"] = methods[name] | {"adaptive": False}
    return methods


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
    spec: dict[str, Any], tmp: Path, watch: LoadWatch, script: Path | None = None
) -> dict[str, Any]:
    """One case in a fresh process (worker.py); a crash or timeout becomes an error record.
    The load is sampled every LOAD_SAMPLE_S while it runs: other work that starts during a
    case is caught, not only work still running between cases."""
    import threading

    from worker import WorkerFailed, run_worker

    done = threading.Event()

    def sample() -> None:
        while not done.wait(LOAD_SAMPLE_S):
            watch.sample()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        result = run_worker(script or Path(__file__), spec, tmp, WORKER_TIMEOUT_S)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}
    finally:
        done.set()
        sampler.join()
    result["wall_s"] = time.perf_counter() - started
    return result


# ----------------------------------------------------------------------------- workers


def run_ingot(spec: dict[str, Any]) -> dict[str, Any]:
    """Every method on its artifact (spec["artifacts"] or else spec["artifact"]), each its own
    LoadedModel and Generator; per run, the methods one after another (plain first), so drift
    of the host hits them alike."""
    from dataclasses import asdict

    from ingot.runtime import LoadedModel, SamplingParams

    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True)
    concurrent = {int(n): p for n, p in spec["concurrent"].items()}
    max_seqs = max([1, *concurrent])
    batched = max([2048] + [sum(map(len, p)) for p in concurrent.values()])
    methods: dict[str, dict | bool] = dict(spec["methods"])
    loaded, generators, errors = {}, {}, {}

    def artifact_of(name: str) -> str | None:
        return spec.get("artifacts", {}).get(name, spec["artifact"])

    def load(name: str, config: dict | bool, artifact: str | None) -> None:
        try:
            if artifact is None:
                method = config["method"]  # an OWN_BUILD method: its own build failed
                raise FileNotFoundError(f"no artifact: its build failed (build.{method})")
            loaded[name] = LoadedModel.load(
                artifact,
                kv_cache_bytes=spec["kv_cache_bytes"],
                max_num_seqs=max_seqs,
                max_num_batched_tokens=batched,
                enable_prefix_caching=False,  # repeated runs of a prompt must compute it again
                speculative_config=config,
            )
            generators[name] = loaded[name].generator()
        except Exception as e:  # e.g. no draft model in the artifact: that row fails alone
            errors[name] = f"{type(e).__name__}: {e}"

    for name, config in methods.items():
        load(name, config, artifact_of(name))
    # Forced on: the same config drafting at every step, at any batch size (for the sizes
    # above the default threshold).
    forced = {}
    for name in spec["concurrent_methods"]:
        config = methods[name]
        if config and name in loaded:
            threshold = loaded[name].speculative.disable_by_batch_size
            if any(n > threshold for n in concurrent):
                forced[name] = f"{name} forced"
                load(forced[name], config | spec["forced"], artifact_of(name))
    configs = {
        name: asdict(model.speculative) if model.speculative else None
        for name, model in loaded.items()
    }
    runs = spec["runs"]
    quiet = Quiet()
    out: dict[str, Any] = {"errors": errors, "configs": configs, "forced": forced}

    batch1: dict[str, Any] = {}
    for set_name, prompts in spec["batch1"].items():
        names = [n for n in methods if n in generators]
        for name in names:  # warm-up: each method's shapes and drafts
            _ingot_one(generators[name], prompts[0], params)
        traces: dict[str, list] = {n: [] for n in names}
        stats: dict[str, Any] = {}
        for run in range(runs):
            for name in names:
                gen = generators[name]
                trace, delta = quiet.call(partial(_one_by_one, gen, prompts, params))
                traces[name].append(trace)
                if run == 0:
                    stats[name] = delta
        batch1[set_name] = {
            name: _batch1_summary(traces[name], traces.get("plain"), stats[name]) for name in names
        }
        _paired(batch1[set_name], "runs", "decode_tokens_per_s", "speedup")
        for name in names:  # one more run, instrumented: where a step's time goes
            batch1[set_name][name]["step_breakdown"] = _breakdown(generators[name], prompts, params)
    out["batch1"] = batch1
    if "plain" in generators:
        _explain_differences(generators["plain"], spec, batch1)

    conc: dict[str, Any] = {}
    for n, prompts in concurrent.items():
        names = [m for m in spec["concurrent_methods"] if m in generators]
        names += [forced[m] for m in names if m in forced and n > _threshold(loaded[m])]
        for name in names:
            _ingot_many(generators[name], prompts, params)  # warm-up
        timed: dict[str, list] = {m: [] for m in names}
        stats = {}
        for run in range(runs):
            for name in names:
                gen = generators[name]
                result, delta = quiet.call(partial(_all_at_once, gen, prompts, params))
                timed[name].append(result)
                if run == 0:
                    stats[name] = delta
        conc[str(n)] = {
            name: _concurrent_summary(timed[name], timed.get("plain"), stats[name])
            for name in names
        }
        _paired(conc[str(n)], "runs_tokens_per_s", None, "ratio_to_plain")
        alone = _get(batch1, "code", "plain", "tokens")
        if "plain" in timed and alone:
            # The control: plain decoding of the same prompts alone against all together.
            together = timed["plain"][0]["tokens"][: len(alone)]
            control = _matches(alone[: len(together)], together)
            conc[str(n)]["plain"]["matches_batch1_plain"] = control
    out["concurrent"] = conc
    out["quiet"] = quiet.summary()
    return out


class Quiet:
    """Runs a timed measurement again while other processes took CPU during it: their CPU
    time is the host's busy time (/proc/stat, steal included) less this process's own."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.records: list[dict[str, float]] = []

    def call(self, measure: Any) -> Any:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            start = self._snapshot()
            result = measure()
            end = self._snapshot()
            wall = end[0] - start[0]
            others = ((end[1] - start[1]) - (end[2] - start[2])) / wall
            if others <= OTHERS_LIMIT_CORES or attempt == MAX_ATTEMPTS:
                self.records.append({"others_cores": others, "attempts": attempt})
                return result
        raise AssertionError("unreachable")

    def summary(self) -> dict[str, Any]:
        return {
            "limit_cores": OTHERS_LIMIT_CORES,
            "max_attempts": MAX_ATTEMPTS,
            "measurements": len(self.records),
            "repeated": sum(r["attempts"] > 1 for r in self.records),
            "extra_attempts": sum(r["attempts"] - 1 for r in self.records),
            "still_disturbed": sum(r["others_cores"] > OTHERS_LIMIT_CORES for r in self.records),
            "max_others_cores_kept": max((r["others_cores"] for r in self.records), default=0),
        }

    def _snapshot(self) -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        # user, nice, system, irq, softirq, steal (idle and iowait are not busy)
        busy = sum(ticks[i] for i in (0, 1, 2, 5, 6, 7)) / self.tick
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system


def _paired(rows: dict[str, Any], runs_key: str, value_key: str | None, out_key: str) -> None:
    """Each row's ratio to plain per run, under `out_key`_runs, and their median under
    `out_key` (runs of one round are adjacent in time, so a slow stretch hits both)."""
    plain = rows.get("plain")
    if plain is None:
        return
    for row in rows.values():
        ratios = [
            (a[value_key] if value_key else a) / (b[value_key] if value_key else b)
            for a, b in zip(row[runs_key], plain[runs_key], strict=True)
        ]
        row[f"{out_key}_runs"] = ratios
        row[out_key] = statistics.median(ratios)


def _one_by_one(gen: Any, prompts: list[list[int]], params: Any) -> tuple[list, dict | None]:
    """The prompts one after another; their traces and the run's speculation counters."""
    before = _stats(gen)
    traces = [_ingot_one(gen, p, params) for p in prompts]
    return traces, _stats_delta(before, _stats(gen))


def _all_at_once(gen: Any, prompts: list[list[int]], params: Any) -> tuple[dict, dict | None]:
    before = _stats(gen)
    result = _ingot_many(gen, prompts, params)
    return result, _stats_delta(before, _stats(gen))


def _threshold(model: Any) -> int:
    return model.speculative.disable_by_batch_size if model.speculative else 0


def _ingot_one(gen: Any, prompt: list[int], params: Any) -> dict[str, Any]:
    """One request alone: its tokens, the time of each (tokens of one step share it), steps."""
    start = time.perf_counter()
    rid = gen.add(prompt, params)
    times, steps = [], 0
    while gen.has_unfinished():
        outputs = gen.step()
        now = time.perf_counter()
        steps += 1
        times += [now for o in outputs if o.request_id == rid]
    tokens = list(gen.pop_completion(rid).token_ids)
    return {"tokens": tokens, "start": start, "times": times, "steps": steps}


def _explain_differences(plain: Any, spec: dict[str, Any], batch1: dict[str, Any]) -> None:
    """For each batch-1 output that differs from plain decoding's: plain decoding's top two
    log-probabilities where they part (a near-tie flipped by rounding has a gap near 0, and
    the speculative token is plain's second choice), under the method's `differences`."""
    from ingot.runtime import SamplingParams

    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True, logprobs=2)
    tops: dict[tuple[str, int], list[dict[int, float]]] = {}
    for set_name, rows in batch1.items():
        prompts = spec["batch1"][set_name]
        plain_tokens = rows["plain"]["tokens"]
        for method, row in rows.items():
            match = row.get("matches_plain")
            if not match or method == "plain":
                continue
            differences = []
            for i, at in enumerate(match["first_difference_at"]):
                if at is None:
                    continue
                if (set_name, i) not in tops:
                    done = plain.generate([prompts[i]], params)[0]
                    same = list(done.token_ids) == plain_tokens[i]
                    tops[set_name, i] = done.top_logprobs if same else None
                if tops[set_name, i] is None:  # asking for logprobs changed plain's path
                    differences.append({"prompt": i, "at": at, "plain_rerun_differs": True})
                    continue
                top = tops[set_name, i][at]
                ranked = sorted(top.items(), key=lambda kv: -kv[1])
                ours = row["tokens"][i][at]
                differences.append(
                    {
                        "prompt": i,
                        "at": at,
                        "plain_token": plain_tokens[i][at],
                        "token": ours,
                        "token_is_plains_second": len(ranked) > 1 and ranked[1][0] == ours,
                        "plain_top2_logprob_gap": ranked[0][1] - ranked[1][1]
                        if len(ranked) > 1
                        else None,
                    }
                )
            match["differences"] = differences


def _breakdown(gen: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    """One run of the prompts with the target's and the drafter's calls timed: per decode
    step (each prompt's prefill step left out), ms in the target engine's call, in the
    drafter (its engines' calls apart: a draft model's session, Medusa's heads graph, the
    EAGLE draft layer's and fc's sessions) and in the rest of the runtime (scheduling, inputs,
    sampling, K/V writes, acceptance); the target call's ms by tokens per sequence."""
    from collections import defaultdict

    step: dict[str, float] = defaultdict(float)  # this step's time per timed call
    step_q: list[tuple[int, float]] = []
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    by_q: dict[int, list[float]] = defaultdict(list)

    class Timed:
        """`inner` with the named methods timed into `step`."""

        def __init__(self, inner: Any, name: str, methods: tuple[str, ...]) -> None:
            self._inner, self._name, self._methods = inner, name, methods

        def __getattr__(self, attr: str) -> Any:
            value = getattr(self._inner, attr)
            if attr not in self._methods:
                return value

            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return value(*args, **kwargs)
                finally:
                    elapsed = time.perf_counter() - started
                    step[self._name] += elapsed
                    step[f"{self._name} calls"] += 1
                    if self._name == "target":
                        step_q.append((int(args[0].input_ids.shape[1]), elapsed))

            return timed

    session, spec = gen.session, gen.speculation
    drafter = spec.drafter if spec is not None else None
    # The drafter's own engines, as (holder, attribute): a draft model's session, the graph of
    # Medusa's heads, or the EAGLE draft's layer and fc sessions (held by its `draft`).
    holders = [drafter, getattr(drafter, "draft", None)] if drafter is not None else []
    engines = [
        (holder, attr, getattr(holder, attr))
        for holder in holders
        for attr in ("session", "heads", "layer", "fc")
        if holder is not None and hasattr(holder, attr)
    ]
    gen.session = Timed(session, "target", ("run",))
    if drafter is not None:  # `record`: the EAGLE drafter keeps the target's features rows
        methods = ("propose", "observe", "accepted", "record")
        spec.drafter = Timed(drafter, "drafter", methods)
    for holder, attr, engine in engines:
        setattr(holder, attr, Timed(engine, "draft_engine", ("run",)))
    steps, wall = 0, 0.0
    try:
        for prompt in prompts:
            rid = gen.add(prompt, params)
            prefill = True
            while gen.has_unfinished():
                step.clear()
                step_q.clear()
                started = time.perf_counter()
                gen.step()
                elapsed = time.perf_counter() - started
                if prefill:  # a prompt's first step is its prefill, not a decode step
                    prefill = False
                    continue
                steps, wall = steps + 1, wall + elapsed
                for key, value in step.items():
                    (calls if key.endswith(" calls") else total)[key] += value
                for q, seconds in step_q:
                    by_q[q].append(seconds)
            gen.pop_completion(rid)
    finally:
        gen.session = session
        if drafter is not None:
            spec.drafter = drafter
        for holder, attr, engine in engines:
            setattr(holder, attr, engine)
    ms = {k: 1000 * v / steps for k, v in total.items()}
    step_ms = 1000 * wall / steps
    return {
        "decode_steps": steps,
        "ms_per_step": step_ms,
        "target_call_ms": ms.get("target", 0.0),
        "target_calls_per_step": calls["target calls"] / steps,
        "drafter_ms": ms.get("drafter", 0.0),  # its engine's calls included
        "draft_engine_ms": ms.get("draft_engine", 0.0),
        "draft_engine_calls_per_step": calls["draft_engine calls"] / steps,
        "runtime_other_ms": step_ms - ms.get("target", 0.0) - ms.get("drafter", 0.0),
        "target_call_ms_by_tokens_per_sequence": {
            str(q): {"calls": len(v), "ms": 1000 * statistics.mean(v)}
            for q, v in sorted(by_q.items())
        },
    }


def _ingot_many(gen: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    start = time.perf_counter()
    ids = [gen.add(p, params) for p in prompts]
    steps = 0
    while gen.has_unfinished():
        gen.step()
        steps += 1
    seconds = time.perf_counter() - start
    tokens = [list(gen.pop_completion(i).token_ids) for i in ids]
    return {"tokens": tokens, "seconds": seconds, "steps": steps}


def _stats(gen: Any) -> dict[str, Any] | None:
    if gen.speculation is None:
        return None
    s = gen.speculation.stats
    return {
        "num_drafts": s.num_drafts,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "accepted_per_position": list(s.accepted_per_position),
    }


def _stats_delta(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    """The counters of one run (SpecDecodeStats is cumulative), with vLLM's derived figures:
    mean accepted length = 1 + accepted / drafts (tokens per verification), and per position
    the share of verifications whose i-th draft token was accepted."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens")}
    delta["num_accepted_tokens"] = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    prior = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    per_pos = [a - b for a, b in zip(after["accepted_per_position"], prior, strict=False)]
    delta["accepted_per_position"] = per_pos
    drafts = delta["num_drafts"]
    delta["mean_accepted_length"] = 1 + delta["num_accepted_tokens"] / drafts if drafts else None
    delta["acceptance_by_position"] = [a / drafts for a in per_pos] if drafts else []
    delta["draft_acceptance_rate"] = (
        delta["num_accepted_tokens"] / delta["num_draft_tokens"]
        if delta["num_draft_tokens"]
        else None
    )
    return delta


def _batch1_summary(
    runs: list[list[dict]], plain: list[list[dict]] | None, stats: dict | None
) -> dict[str, Any]:
    """Per run: decode tok/s over all prompts (tokens after each prompt's first over the time
    after its first), end-to-end tok/s, TTFT, target steps; the median run's figures."""
    per_run = []
    for traces in runs:
        decode_tokens = sum(len(t["times"]) - 1 for t in traces)
        decode_s = sum(t["times"][-1] - t["times"][0] for t in traces)
        total_tokens = sum(len(t["times"]) for t in traces)
        total_s = sum(t["times"][-1] - t["start"] for t in traces)
        steps = sum(t["steps"] - 1 for t in traces)  # the first step is the prefill
        per_run.append(
            {
                "decode_tokens_per_s": decode_tokens / decode_s,
                "e2e_tokens_per_s": total_tokens / total_s,
                "ttft_ms": 1000 * statistics.mean(t["times"][0] - t["start"] for t in traces),
                "decode_steps": steps,
                "ms_per_step": 1000 * decode_s / steps,
                "tokens_per_step": decode_tokens / steps,
            }
        )
    median = statistics.median(r["decode_tokens_per_s"] for r in per_run)
    middle = min(per_run, key=lambda r: abs(r["decode_tokens_per_s"] - median))
    out = {
        "prompts": len(runs[0]),
        "runs": per_run,
        "decode_tokens_per_s": median,
        "e2e_tokens_per_s": statistics.median(r["e2e_tokens_per_s"] for r in per_run),
        "ttft_ms": statistics.median(r["ttft_ms"] for r in per_run),
        "ms_per_step": middle["ms_per_step"],
        "tokens_per_step": middle["tokens_per_step"],
        "speculation": stats,
        # Of the first run's decode steps, the share that verified drafts.
        "drafting_steps_share": stats["num_drafts"] / per_run[0]["decode_steps"] if stats else None,
        "tokens": [t["tokens"] for t in runs[0]],
    }
    if plain is not None:
        out["matches_plain"] = _matches([t["tokens"] for t in plain[0]], out["tokens"])
    return out


def _concurrent_summary(
    runs: list[dict], plain: list[dict] | None, stats: dict | None
) -> dict[str, Any]:
    tokens = sum(map(len, runs[0]["tokens"]))
    per_s = [tokens / r["seconds"] for r in runs]
    out = {
        "requests": len(runs[0]["tokens"]),
        "generated_tokens": tokens,
        "runs_tokens_per_s": per_s,
        "tokens_per_s": statistics.median(per_s),
        "steps": sorted({r["steps"] for r in runs}),
        "speculation": stats,
    }
    if plain is not None:
        out["matches_plain"] = _matches(plain[0]["tokens"], runs[0]["tokens"])
    return out


def _matches(plain: list[list[int]], ours: list[list[int]]) -> dict[str, Any]:
    """How many outputs equal plain decoding's token for token; where the others diverge."""
    diverge = []
    for a, b in zip(plain, ours, strict=True):
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        diverge.append(first)
    return {
        "equal": sum(d is None for d in diverge),
        "of": len(diverge),
        "first_difference_at": diverge,
    }


def run_transformers(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers' generate on the float checkpoint (fp32), greedy, EOS never stopping it
    (no eos_token_id), each prompt through every case in turn; tokens timestamped by a
    streamer (assisted generation puts every verification's tokens at once)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(spec["threads"])
    transformers.logging.set_verbosity_error()
    target = AutoModelForCausalLM.from_pretrained(spec["target"], dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(spec["draft"], dtype=torch.float32).eval()
    for model in (target, draft):
        # generate fills a config's unset fields from the model's generation_config (EOS 1):
        # without one there, nothing stops a sequence before max_new_tokens.
        model.generation_config.eos_token_id = None
    n = spec["tokens"]

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.prompt_seen, self.times = False, []

        def put(self, value: torch.Tensor) -> None:
            if not self.prompt_seen:  # generate puts the prompt first
                self.prompt_seen = True
                return
            self.times += [time.perf_counter()] * value.numel()

        def end(self) -> None:
            pass

    def one(prompt: list[int], fields: dict, assisted: bool) -> dict[str, Any]:
        config = GenerationConfig(
            max_new_tokens=n,
            do_sample=False,
            bos_token_id=0,
            pad_token_id=0,
            **fields,
        )
        ids = torch.tensor([prompt])
        clock = Clock()
        extra = {"assistant_model": draft} if assisted else {}
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                streamer=clock,
                **extra,
            )
        tokens = out[0, len(prompt) :].tolist()
        if len(tokens) != n or len(clock.times) != n:
            raise RuntimeError(f"{len(tokens)} tokens ({len(clock.times)} streamed), wanted {n}")
        return {"tokens": tokens, "start": start, "times": clock.times}

    cases = [(name, fields, assisted) for name, fields, assisted in spec["cases"]]
    quiet = Quiet()
    results: dict[str, Any] = {}
    for set_name, prompts in spec["prompts"].items():
        for _, fields, assisted in cases:  # warm-up
            one(prompts[0], fields, assisted)
        traces: dict[str, list] = {name: [] for name, _, _ in cases}
        for prompt in prompts:
            for name, fields, assisted in cases:
                traces[name].append(quiet.call(partial(one, prompt, fields, assisted)))
        plain = traces[cases[0][0]]
        results[set_name] = {}
        for name, _, _ in cases:
            runs = traces[name]
            decode_tokens = sum(len(t["times"]) - 1 for t in runs)
            decode_s = sum(t["times"][-1] - t["times"][0] for t in runs)
            total_s = sum(t["times"][-1] - t["start"] for t in runs)
            results[set_name][name] = {
                "prompts": len(runs),
                "decode_tokens_per_s": decode_tokens / decode_s,
                "e2e_tokens_per_s": sum(len(t["times"]) for t in runs) / total_s,
                "ttft_ms": 1000 * statistics.mean(t["times"][0] - t["start"] for t in runs),
                "matches_plain": _matches(
                    [t["tokens"] for t in plain], [t["tokens"] for t in runs]
                ),
            }
    return {
        "cases": {name: fields | {"assistant_model": assisted} for name, fields, assisted in cases},
        "assistant_defaults": _assistant_defaults(GenerationConfig),
        "results": results,
        "quiet": quiet.summary(),
    }


def _assistant_defaults(config_class: Any) -> dict[str, Any]:
    """What transformers fills in for the assisted-generation fields a config leaves unset."""
    defaults = config_class._get_default_generation_params()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule")
    out = {k: defaults.get(k) for k in (*keys, "assistant_confidence_threshold")}
    out["max_matching_ngram_size"] = 2  # generate's `max_matching_ngram_size or 2`
    return out


_KINDS = {"ingot": run_ingot, "transformers": run_transformers}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        result = _KINDS[spec["kind"]](spec)
        result["ok"] = True
    except Exception as e:  # recorded in the report, never dropped
        text = "".join(traceback.format_exception(e)).strip()
        tail = "\n".join(text.splitlines()[-12:])
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tail}
    return result | memory_status()


# ----------------------------------------------------------------------------- report


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
            "engine": "onnxruntime cpu, level extended, MatMulNBits accuracy level 4",
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


def write_reports(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    for rows in (_get(report["results"], "ingot", "batch1") or {}).values():
        for row in rows.values():  # compared already (matches_plain): 100k numbers left out
            row.pop("tokens", None)
    report["targets"] = target_verdicts(report["results"])
    return write_report_files(report, out_dir, "speculative", markdown)


# The issue's targets at batch 1 on code prompts, and under load.
SPEEDUP_TARGETS = {"ngram k=4": 1.3, "draft_model k=4": 1.5, "medusa k=4": 1.6, "eagle k=3": 2.0}
# transformers' counterpart of a method; it has no Medusa or EAGLE decoding, so those have none.
PEER_OF = {"ngram k=4": "prompt_lookup_num_tokens=4", "draft_model k=4": "assistant_model k=4"}
MAX_SLOWDOWN_AT_32 = 0.05


def target_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    verdicts = []
    code = _get(results, "ingot", "batch1", "code") or {}
    peer = _get(results, "transformers", "results", "code") or {}
    for method, goal in SPEEDUP_TARGETS.items():
        speedup = _speedup(code, method)
        verdicts.append(
            {
                "statement": f"{method}: batch-1 speedup >= {goal}x on code prompts",
                "value": speedup,
                "met": None if speedup is None else speedup >= goal,
            }
        )
        if method not in PEER_OF:
            continue
        theirs = _speedup(peer, PEER_OF[method])
        verdicts.append(
            {
                "statement": f"{method}: speedup >= transformers' {PEER_OF[method]}",
                "value": [speedup, theirs],
                "met": None if speedup is None or theirs is None else speedup >= theirs,
            }
        )
    for method, row in _ordered(_get(results, "ingot", "concurrent", "32") or {}):
        ratio = _ratio(row, (_get(results, "ingot", "concurrent", "32") or {}).get("plain"))
        if method == "plain" or method.endswith("forced") or ratio is None:
            continue
        verdicts.append(
            {
                "statement": f"{method}: 32 concurrent requests no more than "
                f"{MAX_SLOWDOWN_AT_32:.0%} slower than speculation off",
                "value": ratio,
                "met": ratio >= 1 - MAX_SLOWDOWN_AT_32,
            }
        )
    return verdicts


def markdown(report: dict[str, Any]) -> str:
    settings, machine, results = report["settings"], report["machine"], report["results"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    lines = []
    if report.get("refused"):
        lines += [f"**REFUSED: {report['refused']}**", ""]
    lines += [
        "# Speculative decoding: ingot (n-gram, draft model, Medusa, EAGLE-3) and transformers' "
        "assisted generation",
        "",
        f"{machine['date']} on {machine['cpu_model']}, {machine['usable_cores']} cores, "
        f"{machine['ram_bytes'] / (1 << 30):.1f} GiB RAM; {versions}; ingot at "
        f"{machine['code']['commit'][:12]}"
        + (" with uncommitted changes" if machine["code"]["dirty"] else "")
        + ".",
        f"Target {settings['target']} ({settings['weights']}; {settings['engine']}), draft "
        f"{settings['draft']} built into the same artifact; the Medusa rows and the EAGLE rows "
        "each load another artifact of the same target with their drafter trained in its "
        "build (an artifact holds one drafter). EAGLE drafts k = 3 tokens a step where the "
        "draft model and Medusa draft 4: each of its tokens is one more draft-layer call after "
        "the previous one, and its training unrolls "
        f"{settings['eagle']['train']['ttt_steps']} drafting steps. Prompts: "
        f"{settings['prompt_tokens']}"
        f' tokens of the held-out pydoc-eval.txt ("code": the windows richest in Python code '
        'lines; "text": windows with none), '
        f"{settings['new_tokens']} new tokens each, greedy, EOS ignored, "
        f"{settings['threads']} threads; {settings['runs']} runs, every method's runs "
        "interleaved with plain decoding's in one process: tok/s is the median run, a speedup "
        "or on / off ratio the median of each run's ratio to plain's run of the same round "
        "(the range over runs in brackets).",
        _quiet_line(results),
    ]
    ingot = results.get("ingot", {})
    if not ingot.get("ok"):
        lines += ["", f"ingot failed: {ingot.get('error')}"]
    lines += ["", "## Batch 1 (one request at a time)", ""]
    lines += [
        "tok/s counts decode steps only (the first token comes from the prefill). The "
        "runtime's default is adaptive drafting: it times decode steps with and without drafts "
        "per batch-size bucket and drafts only where drafting has emitted more tokens per "
        'second; "adaptive off" drafts at every step it can. drafting: share of decode steps '
        "that verified drafts; tokens/step: tokens per target step; mean accepted length = 1 + "
        "accepted drafts per verification (steps that drafted); acceptance by position: share "
        "of verifications whose i-th draft token was accepted; = plain: prompts whose tokens "
        "equal plain decoding's.",
        "",
        "| method | prompts | tok/s | speedup | drafting | tokens / step | ms / step | mean "
        "accepted length | acceptance by position | = plain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for set_name, rows in _ordered(ingot.get("batch1") or {}, SETS):
        for method, row in _ordered(rows):
            spec = row.get("speculation") or {}
            by_pos = " / ".join(f"{a:.2f}" for a in spec.get("acceptance_by_position", []))
            mal = spec.get("mean_accepted_length")
            match = row.get("matches_plain")
            lines.append(
                f"| {method} | {set_name} ({row['prompts']}) | {row['decode_tokens_per_s']:.0f} "
                f"| {_fmt(_speedup(rows, method))}{_spread(row.get('speedup_runs'))} "
                f"| {_pct(row.get('drafting_steps_share'))} "
                f"| {row['tokens_per_step']:.2f} "
                f"| {row['ms_per_step']:.2f} | {_fmt(mal)} | {by_pos or '–'} "
                f"| {_share(match) if method != 'plain' else '–'} |"
            )
    for name, error in (ingot.get("errors") or {}).items():
        lines.append(f"| {name} | – | failed: {error} | | | | | | | |")
    lines += _breakdown_section(ingot)
    for method in OWN_BUILD:
        lines += _drafter_section(method, results.get("build") or {}, settings)
    lines += ["", "## Concurrent requests (all submitted at once to one Generator)", ""]
    conc = dict(sorted((ingot.get("concurrent") or {}).items(), key=lambda kv: int(kv[0])))
    lines += [
        "Generated tokens over the wall time (prefill included), code prompts. on / off: "
        "against plain decoding in the same run. With the default thresholds a step with more "
        'than `disable_by_batch_size` (8) decoding requests does not draft; "forced": '
        f"{settings['forced']} (every step of every request drafts). = plain: outputs equal "
        "to plain decoding's at the same concurrency; on the plain row, the control: plain outputs "
        'equal to the same prompts\' decoded one at a time ("alone").',
        "",
        "| method | " + " | ".join(f"{n} req tok/s | on / off" for n in conc) + " | = plain |",
        "|---|" + "---:|---:|" * len(conc) + "---:|",
    ]
    names: list[str] = []
    for rows in conc.values():
        names += [m for m, _ in _ordered(rows) if m not in names]
    for method in names:
        cells, match_cells = [], []
        for rows in conc.values():
            row = rows.get(method)
            if row is None:
                cells += ["–", "–"]
                continue
            ratio = _fmt(_ratio(row, rows.get("plain"))) + _spread(row.get("ratio_to_plain_runs"))
            cells += [f"{row['tokens_per_s']:.0f}", ratio]
            match = row.get("matches_batch1_plain" if method == "plain" else "matches_plain")
            if match:
                match_cells.append(_share(match) + (" alone" if method == "plain" else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {', '.join(match_cells) or '–'} |")
    peer = results.get("transformers", {})
    lines += ["", "## transformers' assisted generation (side by side, same prompts)", ""]
    if not peer.get("ok"):
        lines += [f"transformers failed: {peer.get('error')}"]
    else:
        defaults = peer["assistant_defaults"]
        lines += [
            f"{settings['target']} in fp32 (torch CPU, {settings['threads']} threads), greedy "
            f"`generate`, first {settings['peer_prompts']} prompts of each set, one run after a "
            "warm-up; decode tok/s from a streamer's timestamps. assistant_model = "
            f'{settings["draft"]} in fp32; "defaults": {defaults["num_assistant_tokens"]} '
            f"tokens, {defaults['num_assistant_tokens_schedule']} schedule, stopping below "
            f"{defaults['assistant_confidence_threshold']} confidence; prompt lookup matches up "
            f"to {defaults['max_matching_ngram_size']}-grams. The ingot columns: the same "
            "prompts' speedup of the ingot method with the same kind of drafter. transformers "
            "has no Medusa or EAGLE decoding: the medusa and eagle rows have no counterpart "
            "here.",
            "",
            "| transformers | prompts | tok/s | speedup | = plain | ingot method | ingot speedup |",
            "|---|---|---:|---:|---:|---|---:|",
        ]
        ours_of = {v: k for k, v in PEER_OF.items()} | {
            "assistant_model (defaults)": "draft_model k=4"
        }
        for set_name, rows in _ordered(peer["results"], SETS):
            for case, row in _ordered(rows, [name for name, _, _ in PEER_CASES]):
                match = row["matches_plain"]
                method = ours_of.get(case)
                ours = _speedup((ingot.get("batch1") or {}).get(set_name) or {}, method)
                lines.append(
                    f"| {case} | {set_name} ({row['prompts']}) | {row['decode_tokens_per_s']:.0f}"
                    f" | {_fmt(_speedup(rows, case))} "
                    f"| {_share(match) if case != 'plain' else '–'} "
                    f"| {method or '–'} | {_fmt(ours)} |"
                )
    lines += ["", "## Targets (issue 14)", ""]
    for verdict in report["targets"]:
        met = {True: "met", False: "NOT met", None: "no figure"}[verdict["met"]]
        value = verdict["value"]
        shown = " vs ".join(_fmt(v) for v in value) if isinstance(value, list) else _fmt(value)
        lines.append(f"- {verdict['statement']}: {shown} — {met}")
    lines += ["", "## Notes", ""]
    lines += _notes(report)
    return "\n".join(lines) + "\n"


def _breakdown_section(ingot: dict[str, Any]) -> list[str]:
    rows = _get(ingot, "batch1", "code") or {}
    if not any("step_breakdown" in row for row in rows.values()):
        return []
    lines = [
        "",
        "## Where a decode step's time goes (batch 1, code prompts)",
        "",
        "One more run of the code prompts with the engine calls timed (ms per decode step). "
        "target call: the target engine's session call (by tokens per sequence: 1 = plain "
        "decoding, k + 1 = verification); drafter: proposing drafts, its engine's calls "
        "included (in brackets: ms in the draft engine, the Medusa heads' graph, or the EAGLE "
        "draft layer and its fc, and their calls per step: EAGLE calls fc once and the layer "
        "k times per drafting step); rest: the runtime around them "
        "(scheduling, inputs, sampling, K/V writes, acceptance).",
        "",
        "| method | ms / step | target call | target call by tokens / sequence | drafter "
        "(draft engine, calls) | rest of the runtime | tokens / step |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for method, row in _ordered(rows):
        b = row.get("step_breakdown")
        if not b:
            continue
        by_q = ", ".join(
            f"{q}: {v['ms']:.2f}" for q, v in b["target_call_ms_by_tokens_per_sequence"].items()
        )
        drafter = (
            f"{b['drafter_ms']:.2f} ({b['draft_engine_ms']:.2f}, "
            f"{b['draft_engine_calls_per_step']:.1f})"
            if method != "plain"
            else "–"
        )
        lines.append(
            f"| {method} | {b['ms_per_step']:.2f} | {b['target_call_ms']:.2f} | {by_q} "
            f"| {drafter} | {b['runtime_other_ms']:.2f} | {row['tokens_per_step']:.2f} |"
        )
    return lines


def _drafter_section(method: str, build: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """An OWN_BUILD method's build: what its drafter's stage cost, and the training report of
    its manifest."""
    built = build.get(method)
    if built is None:  # not attempted: the target's own build failed
        return []
    own = OWN_BUILD[method]
    lines = ["", f"## {own.title} (trained in the build)", ""]
    drafter = built.get("drafter") or {}
    if not built.get("ok") or "error" in drafter:
        error = built.get("error") or drafter.get("error")
        return [*lines, f"The {own.title} build failed: {error}. The {method} rows report it."]
    train, cal = settings[method]["train"], settings[method]["calibration"]
    t, stage = drafter.get("training") or {}, drafter.get("stage") or {}
    windows = t.get("windows") or {}
    peak = "–" if stage.get("cached") else _gib(stage.get("peak_rss_bytes"))
    text = _DRAFTER_TEXT[method](drafter, train)
    lines += [
        f"{text.what}, on {windows.get('train')} of {cal['samples']} windows of "
        f"{cal['seq_len']} tokens of {Path(settings['calib_text']).name}, the other "
        f"{windows.get('held_out')} held out. This build's stages: "
        f"{_stage_runs(built.get('stages') or [])}.",
        "",
        f"{own.stage} stage: its wall time ({text.stage_work}) and the build process's peak RSS "
        f"during it; a stage-cache hit ({own.title} trained by an earlier run) shows `cached` "
        f"and no peak. training: {text.timed}, from the manifest's training report (so also "
        f"after a hit). {text.legend}",
        "",
        f"| {own.stage} stage | peak RSS | training | steps | loss first → last | {text.column} |",
        "|---:|---:|---:|---:|---|---|",
        f"| {_stage_time(stage)} | {peak} | {_seconds(t.get('seconds'))} | {t.get('steps', '–')} "
        f"| {_fmt(t.get('loss_first'))} → {_fmt(t.get('loss_last'))} "
        f"| {' / '.join(f'{a:.2f}' for a in t.get(text.key) or []) or '–'} |",
    ]
    return lines


class DrafterText(NamedTuple):
    """An OWN_BUILD drafter's own words in its section of the report."""

    what: str  # what the drafter is and how it learns
    stage_work: str  # what its stage's wall time covers
    timed: str  # what the training report's seconds cover
    legend: str  # the loss and the held-out figure
    column: str  # the held-out figure's header
    key: str  # and its field of the training report


def _medusa_text(heads: dict[str, Any], train: dict[str, Any]) -> DrafterText:
    return DrafterText(
        what=f"{heads['num_heads']} heads of {heads['num_layers']} residual block(s) "
        f"({heads['origin']}), trained by the build's `heads` stage by self-distillation: from "
        "the quantized target's final hidden state at a position, head i learns the target's "
        "own next-token distribution i positions after the target's next token there (draft "
        f"token i); {train['steps']} AdamW steps of {train['batch_size']} positions at "
        f"learning rate {train['learning_rate']}",
        stage_work="the target's hidden states, the training, the graph's export",
        timed="the optimizer steps alone",
        legend="loss: KL(target || head) averaged over the heads, mean of the first and of the "
        "last 10 steps. held-out agreement: per head, the share of held-out positions where "
        "its token is the target's greedy token, the tokens before it being the calibration "
        "text's; the batch-1 table's acceptance by position follows the target's own tokens "
        "and needs every earlier draft accepted too.",
        column="held-out agreement by head",
        key="held_out_agreement",
    )


def _eagle_text(eagle: dict[str, Any], train: dict[str, Any]) -> DrafterText:
    ttt = train["ttt_steps"]
    mal = (eagle.get("training") or {}).get("mean_accepted_length")
    return DrafterText(
        what=f"One draft decoder layer ({eagle['origin']}; the target's attention and MLP "
        f"shapes, hidden size {eagle['hidden_size']}), trained by the build's `eagle` stage by "
        "self-distillation: from the quantized target's residual streams entering layers "
        f"{', '.join(map(str, eagle['aux_layers']))} (concatenated, through fc) and the next "
        "token's embedding it learns the target's own distribution of the token after that, "
        f"and again from its own output for {ttt - 1} more positions (EAGLE-3's training-time "
        f"test: {ttt} drafting steps unrolled); {train['steps']} AdamW steps of "
        f"{train['batch_size']} spans of {train['span']} tokens at learning rate "
        f"{train['learning_rate']}",
        stage_work="the target's features, the training, the two graphs' export and check; "
        "the build's target graph outputs those features too, so its export and engine stages "
        "are not the other builds'",
        timed="the optimizer steps and the held-out acceptance's evaluation",
        legend="loss: KL(target || draft) summed over the drafting steps, step j's weighted "
        "0.8^j, mean of the first and of the last 10 steps. held-out acceptance: per draft "
        "position i, the share of chains on the held-out windows whose drafts 1 .. i all equal "
        "the target's greedy tokens, drafted as the runtime drafts (the first from the "
        "target's features, each next from the draft's own output); the tokens a chain "
        "continues from are the calibration text's, where the batch-1 table's are the "
        f"target's own. Mean accepted length by these: {_fmt(mal)}.",
        column="held-out acceptance by position",
        key="held_out_acceptance",
    )


_DRAFTER_TEXT = {"medusa": _medusa_text, "eagle": _eagle_text}


def _stage_runs(stages: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['stage']} {_stage_time(s)}" for s in stages) or "–"


def _stage_time(stage: dict[str, Any]) -> str:
    if not stage:
        return "–"
    return "cached" if stage["cached"] else _seconds(stage["seconds"])


def _notes(report: dict[str, Any]) -> list[str]:
    """What the tables do not say by themselves: the step cost behind each speedup, and why
    an output can differ from plain decoding's."""
    ingot = report["results"].get("ingot") or {}
    notes = []
    code = _get(ingot, "batch1", "code") or {}
    plain = code.get("plain")
    if plain:
        for method, row in _ordered(code):
            if method == "plain":
                continue
            cost = row["ms_per_step"] / plain["ms_per_step"]
            notes.append(
                f"- {method}, code prompts: {row['tokens_per_step']:.2f} tokens per target "
                f"step at {cost:.2f}x plain's step time ({row['ms_per_step']:.2f} against "
                f"{plain['ms_per_step']:.2f} ms) gives {row['tokens_per_step'] / cost:.2f}x; "
                f"the measured speedup is {_fmt(_speedup(code, method))}x."
            )
        plain_call = _one_token_call_ms(plain)
        for method, row in _ordered(code):
            call = _one_token_call_ms(row)
            if "draft_model" in method and call and plain_call and call > 1.2 * plain_call:
                notes.append(
                    f"- {method}: the target's one-token call costs {call:.2f} ms against "
                    f"plain's {plain_call:.2f} ms. The draft engine's session has its own ONNX "
                    "Runtime intra-op thread pool beside the target's, each of the recipe's "
                    "threads, so on this host 4 threads share 2 cores (measured apart from "
                    "this run: with the draft session on 1 thread the target's one-token call "
                    "is back near plain's, and the verification calls are faster too)."
                )
        calls = (_get(code, "ngram k=4 adaptive off", "step_breakdown") or {}).get(
            "target_call_ms_by_tokens_per_sequence"
        ) or {}
        k1 = str(max((int(q) for q in calls), default=0))
        if "1" in calls and k1 != "1":
            row = code["ngram k=4 adaptive off"]
            mal = (row.get("speculation") or {}).get("mean_accepted_length")
            notes.append(
                f"- Verification is not free at this size: the target's call over {k1} tokens "
                f"costs {calls[k1]['ms']:.2f} ms against {calls['1']['ms']:.2f} ms over one "
                f"({calls[k1]['ms'] / calls['1']['ms']:.1f}x; ngram k=4 adaptive off), so a "
                "verification must keep about that many tokens to pay for itself; it keeps "
                f"{_fmt(mal)} (mean accepted length), and "
                f"{_pct(row.get('drafting_steps_share'))} of the steps find an n-gram to draft "
                "from."
            )
        notes.append(
            f"- A plain step costs {plain['ms_per_step']:.2f} ms at batch 1, most of it fixed "
            "per call (the runtime around ONNX Runtime and the session call itself: "
            "benchmarks/results/decode.md), not weight reads. A step that verifies k + 1 "
            "tokens pays that fixed part once, so the gain is bounded by tokens per step; a "
            "draft model and an EAGLE draft add their own k calls per step, each with the same "
            "kind of fixed cost."
        )
    gaps, second, total = [], 0, 0
    for rows in (ingot.get("batch1") or {}).values():
        for row in rows.values():
            for d in (row.get("matches_plain") or {}).get("differences", []):
                total += 1
                if d.get("plain_top2_logprob_gap") is not None:
                    gaps.append(d["plain_top2_logprob_gap"])
                    second += bool(d["token_is_plains_second"])
    if total:
        notes.append(
            f"- Batch-1 outputs that differ from plain decoding's: {total} (over the methods and "
            f"prompt sets). Where they part, the speculative token is plain decoding's second "
            f"choice in {second}, and plain's top two log-probabilities are "
            f"{statistics.median(gaps):.3f} apart at the median ({max(gaps):.3f} at most)"
            + (": near-ties." if max(gaps) < NEAR_TIE else ".")
            if gaps
            else f"- Batch-1 outputs that differ from plain decoding's: {total}."
        )
    notes += [
        "- = plain: greedy speculative decoding is exact in exact arithmetic, but the engine "
        "rounds activations to int8 at run time (MatMulNBits accuracy level 4) and a call over "
        "k + 1 tokens per sequence (verification) or over many sequences does not run the "
        "arithmetic of a call over one token (other kernel paths, another summation order): a "
        "near-tie between the two best tokens can flip, and every later token then follows the "
        "other branch. A prompt that differs is counted, not failed (first_difference_at in "
        "the JSON says where); the plain row of the concurrent table is the control: "
        "batching alone, no speculation.",
        "- transformers runs the float checkpoint (fp32) in torch, ingot the int4 artifact: "
        "compare speedups (each over its own plain decoding) and absolute tok/s separately. "
        "transformers' prompt lookup matches n-grams of up to 2 tokens, ingot's up to "
        f"{NGRAM_LOOKUP['prompt_lookup_max']}.",
    ]
    return notes


SETS = ("code", "text")


def _ordered(rows: dict[str, Any], order: Any = None) -> list[tuple[str, Any]]:
    """`rows` in the benchmark's order (the JSON is written with sorted keys): the methods as
    ingot_methods lists them, each forced variant after its method; then anything else."""
    if order is None:
        order = []
        for name in ingot_methods():
            order += [name, f"{name} forced"]
    rank = {name: i for i, name in enumerate(order)}
    return sorted(rows.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _quiet_line(results: dict[str, Any]) -> str:
    parts = []
    for engine in ("ingot", "transformers"):
        q = (results.get(engine) or {}).get("quiet")
        if q:
            parts.append(
                f"{engine}: {q['repeated']} of {q['measurements']} repeated, "
                f"{q['still_disturbed']} still disturbed after {q['max_attempts']} attempts"
            )
    if not parts:
        return ""
    return (
        "A timed run (ingot: one method over all the prompts; transformers: one prompt) is "
        f"repeated while other processes used more than {OTHERS_LIMIT_CORES} cores during it "
        "(host busy time from /proc/stat, steal included, less the worker's own): "
        + "; ".join(parts)
        + "."
    )


def _one_token_call_ms(row: dict[str, Any]) -> float | None:
    by_q = (row.get("step_breakdown") or {}).get("target_call_ms_by_tokens_per_sequence") or {}
    return by_q.get("1", {}).get("ms")


def _speedup(rows: dict[str, Any], method: str | None) -> float | None:
    """ingot: the median over runs of each run's ratio to plain's run of the same round;
    transformers (one run): the ratio of the totals."""
    if not method or method not in rows or "plain" not in rows:
        return None
    if "speedup" in rows[method]:
        return rows[method]["speedup"]
    return rows[method]["decode_tokens_per_s"] / rows["plain"]["decode_tokens_per_s"]


def _ratio(row: dict[str, Any] | None, plain: dict[str, Any] | None) -> float | None:
    if not row or not plain:
        return None
    if "ratio_to_plain" in row:
        return row["ratio_to_plain"]
    return row["tokens_per_s"] / plain["tokens_per_s"]


def _spread(values: list[float] | None) -> str:
    """The range over runs, for a ratio shown as a median."""
    if not values or len(values) < 2 or min(values) == max(values) == 1:  # plain's own row
        return ""
    return f" ({min(values):.2f}–{max(values):.2f})"


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _share(match: dict[str, Any] | None) -> str:
    return "–" if not match else f"{match['equal']}/{match['of']}"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def _gib(value: int | None) -> str:
    return "–" if value is None else f"{value / (1 << 30):.2f} GiB"


# ----------------------------------------------------------------------------- plumbing


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
    args = parser.parse_args(argv)
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "ingot-speculative-quick"
        args.out_dir = quick_dir if args.quick else HERE / "results"
    return args


if __name__ == "__main__":
    if len(sys.argv) == 3 and all(a.endswith(".json") for a in sys.argv[1:]):
        spec_file, result_file = sys.argv[1:3]  # a worker (worker.run_worker)
        outcome = run_spec(json.loads(Path(spec_file).read_text()))
        Path(result_file).write_text(json.dumps(outcome))
        sys.exit(0)
    sys.exit(main())
