"""Decode speed of ingot's engines side by side with onnxruntime-genai, OpenVINO GenAI and
llama.cpp, on one host.

Reproduce (alone on a quiet machine; about 30 minutes on 2 cores, the committed report's time
is its `wall_s`; some minutes more the first time, which builds the 1B checkpoint and every
engine's model into the benchmark cache; writes benchmarks/results/decode.json, decode.md and
the context part's plot decode_context.png, drawn with matplotlib from the dev extra):

    benchmarks/peers/setup.sh onnxruntime-genai llama-cpp openvino-genai
    .venv/bin/python -m benchmarks.decode.decode

Options: [--models pydoc-16m,llama-1b-shape] [--tokens 128] [--batch 32] [--runs 3]
[--engines ingot,ingot-openvino,onnxruntime-genai,openvino-genai,llama.cpp]
[--parts batch1,batched,context,prefill,profile] [--contexts 32,1024,2048,4096]
[--context-models llama-1b-shape] [--context-tokens 32] [--context-runs 1]
[--prefill-models pydoc-16m] [--prefill-prompts 32] [--prefill-len 256] [--threads 2]
[--wait-idle SECONDS] [--models-dir DIR] [--eval-text FILE] [--ortgenai-python PATH]
[--openvino-genai-python PATH] [--llama-cpp-python PATH] [--out-dir DIR] [--quick]
[--report-only]. `--quick` is a smoke run (pydoc-16m, 16 tokens, batch 4, one run, a small
prefill, contexts of 32-512 tokens on pydoc-16m) written to a temporary directory, never over
the committed results; `--report-only` writes decode.md and the plot again from decode.json.

Every engine gets the same weights' format: RTN int4, groups of 32, symmetric, lm_head
included, int8 activations in the matmuls (MatMulNBits accuracy level 4; llama.cpp's Q4_0 dot
products and OpenVINO's dynamic quantization do the same), the same thread count, greedy
decoding with EOS ignored:

- ingot and ingot-openvino: one artifact built here (artifact.py) with two engine targets,
  ONNX Runtime's and OpenVINO's (where this ingot has the `openvino` target), KV fp32 in blocks
  of 32 tokens (the only size OpenVINO's CPU plugin runs), each row opening its engine through
  the runtime's engine override (`LoadedModel.load(engine=...)`);
- onnxruntime-genai: its own model builder (`-p int4 -e cpu --extra_options int4_block_size=32
  int4_accuracy_level=4`) on the same checkpoint;
- openvino-genai: optimum-intel's export of the same checkpoint (`--weight-format int4
  --group-size 32 --sym --ratio 1.0 --all-layers`), LLMPipeline at batch 1,
  ContinuousBatchingPipeline for several sequences (ovgenai.py), its own defaults on this CPU
  (bf16 inference, u8 KV);
- llama.cpp (llama-cpp-python): the GGUF (Q4_0) ingot's build writes with `interop: [gguf]`.

Measured, per model (pydoc-16m, trained; the Llama-3.2-1B shape with random weights, vocab
32000), each engine in its own process after a warm-up, in `--runs` interleaved rounds: each
round times one run of every engine in turn (the order rotated each round) and then the memory
bandwidth, so drift of the host hits every engine alike (harness.rounds, rounds.py); medians over
rounds:

1. batch 1: decode tok/s (TTFT apart), TPOT p50 / p99, the ratios of ingot's engines to each
   peer and to the best peer of the row (medians of the rounds' paired ratios), the fraction
   of the memory-bandwidth bound (each round's rate over the bound from that round's bandwidth
   and the bytes each step must read in each engine's format: traffic.py), greedy agreement
   with the fp32 IR (pydoc-16m only);
2. `--batch` prompts decoding together: ingot adds them all to one Generator (in-flight
   batching), onnxruntime-genai runs one static batch, OpenVINO GenAI its continuous
   batching, llama.cpp one llama_batch with a sequence id per prompt;
3. context (context.py, `--context-models` only): batch-1 decode after prompts of each of
   `--contexts` tokens, TTFT, the peak RSS of the longest prompt's prefill, ratios to the best
   peer per point, and the plot of decode tok/s against context; `--context-runs` rounds
   (one by default, to keep the whole run near 30 minutes on 2 cores);
4. prefill (ingot only): `--prefill-prompts` prompts of `--prefill-len` tokens at once, against
   the same kind of tokens as one packed sequence. A sequence cannot exceed the model's
   context (pydoc-16m: 1024), so the packed case is scaled down: 4 prompts at once against
   their concatenation, cut to max_seq_len - 1 tokens; tokens/s compares them;
5. ingot's step time by ONNX Runtime op type (its profiler) at batch 1 and at `--batch`: shares
   only, since the profiler inflates the time of each node;
6. the host's load between cases (harness.load.LoadWatch): a run whose load exceeded the
   thread count is written with a REFUSED line at the top and exits 1.

Issue 27's decode targets are judged from these for each of ingot's engines (targets.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import (
    MATMUL_ACCURACY_LEVEL,
    WORKER,
    DecodeArtifact,
    build_spec,
    export_max_seq_len,
    find_gguf,
    gguf_available,
    openvino_available,
    prune_stale_caches,
)
from benchmarks.decode.context import context_part
from benchmarks.decode.graphs import artifact_graphs
from benchmarks.decode.models import MODELS, PROMPT_LEN, BenchModel, prepare_model
from benchmarks.decode.peers import (
    LLAMA_CPP,
    LLAMA_CPP_DISTRIBUTION,
    OPENVINO_GENAI,
    ORTGENAI,
    build_ortgenai,
    export_openvino_genai,
    set_ortgenai_threads,
)
from benchmarks.decode.report import STEM, markdown, publish_report, replot
from benchmarks.decode.rounds import OURS, merge_rounds, pair_ratios, round_bounds
from benchmarks.decode.traffic import (
    FLOAT32,
    INT4_G32,
    Q4_0,
    decode_traffic,
    mean_decode_context,
)
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, wait_idle
from benchmarks.harness.machine import machine_info, measure_bandwidth
from benchmarks.harness.paths import (
    RESULTS,
    data_dir,
    missing_peer,
    models_dir,
    peer_python,
    peer_version,
)
from benchmarks.harness.report import add_report_only, rerender
from benchmarks.harness.rounds import interleave
from ingot.pipeline.model.config import ModelConfig

DEFAULT_THREADS = 2  # what the committed results ran with (a 2-core host)
ENGINES = (*OURS, "onnxruntime-genai", "openvino-genai", "llama.cpp")
PARTS = ("batch1", "batched", "context", "prefill", "profile")
# The engine override (LoadedModel.load's `engine`, a kind) that opens each of the artifact's
# engines: the first compatible one of that kind.
ORT_ENGINE, OPENVINO_ENGINE = "onnxruntime", "openvino"
OPENVINO_BLOCK_SIZE = 32  # the only KV block size OpenVINO's CPU plugin runs
# The artifact: KV blocks of 32 tokens (the only size OpenVINO's CPU plugin runs) for both
# engines, and room for the context part's longest prompt and its new tokens.
CONTEXT_MAX_SEQ_LEN = 4352
REFERENCE = "ir-fp32"  # greedy reference on the trained model
WARMUP_TOKENS = 8  # each step reads every weight, so a few steps page them all in
DECODE_BUDGET_S = 300  # a round's timed run; a slower engine gets a shorter one (flagged)
REDUCED_BUDGET_S = 90  # that shorter run
PROFILE_TOKENS = 32  # decode steps under the profiler (steady state; the profiler is slow)
PROFILE_SKIP_STEPS = 2  # decode steps after the prefill left out of the profile as warm-up
PACKED_PROMPTS = 4  # the packed-prefill comparison: this many prompts vs their concatenation
WORKER_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 3600
# Bytes per element of each engine's KV cache: ingot's recipe (on either engine) and
# onnxruntime-genai's CPU build keep fp32, llama.cpp's default cache is f16, OpenVINO GenAI's
# u8 (its per-block scales and zero points left out).
KV_BYTES = {
    "ingot": 4,
    "ingot-openvino": 4,
    "onnxruntime-genai": 4,
    "openvino-genai": 1,
    "llama.cpp": 2,
    REFERENCE: 4,
}
# OpenVINO GenAI's export keeps fp16 scales per group of 32, as Q4_0 does.
WEIGHTS = {
    "ingot": INT4_G32,
    "ingot-openvino": INT4_G32,
    "onnxruntime-genai": INT4_G32,
    "openvino-genai": Q4_0,
    "llama.cpp": Q4_0,
    REFERENCE: FLOAT32,
}
QUICK = dict(
    tokens=16,
    batch=4,
    runs=1,
    prefill_prompts=8,
    prefill_len=64,
    contexts="32,256,512",
    context_models="pydoc-16m",
    context_tokens=8,
)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        status = rerender(args.out_dir, STEM, markdown)
        replot(args.out_dir)
        return status
    watch = LoadWatch(args.threads)
    idle_wait_s = wait_idle(args.wait_idle, _log)
    started = time.perf_counter()
    for path in prune_stale_caches():
        _log(f"removed {path} (built by other ingot code)")
    machine = machine_info() | {"waited_for_idle_s": idle_wait_s}
    bandwidth = [measure_bandwidth(args.threads)]
    watch.sample()
    results: dict[str, Any] = {"models": {}}
    with tempfile.TemporaryDirectory(prefix="ingot-bench-") as tmp_dir:
        bench = Bench(args, Path(tmp_dir), watch)
        for name in args.models:
            _log(f"model {name}: preparing")
            model = prepare_model(name, args.models_dir, args.eval_text)
            results["models"][name] = bench.model(model)
    bandwidth.append(measure_bandwidth(args.threads))
    refused = watch.refusal()
    report = _report(machine, bandwidth, results, args, watch, refused)
    report["wall_s"] = time.perf_counter() - started
    _log(f"done in {report['wall_s']:.0f} s")
    return publish_report(report, args.out_dir)


class Bench:
    """The cases of one model, each in a worker process; the load sampled after each."""

    def __init__(self, args: argparse.Namespace, tmp: Path, watch: LoadWatch) -> None:
        self.args, self.tmp, self.watch = args, tmp, watch

    @staticmethod
    def log(message: str) -> None:
        _log(message)

    def model(self, model: BenchModel) -> dict[str, Any]:
        args = self.args
        out: dict[str, Any] = {"config": _model_summary(model)}
        builds = out["builds"] = {}
        artifact, builds["ingot"] = self._build_ingot(model, self.artifact_shape(), True)
        if self.separate_openvino_artifact():
            shape = DecodeArtifact(OPENVINO_BLOCK_SIZE, CONTEXT_MAX_SEQ_LEN, openvino=True)
            _, builds["ingot-openvino"] = self._build_ingot(model, shape, False)
        peer_dirs: dict[str, Path | None] = {}
        timed = {"batch1", "batched", "context"} & set(args.parts)
        if "onnxruntime-genai" in args.engines and timed:
            builds["onnxruntime-genai"], peer_dirs["onnxruntime-genai"] = self._build_ortgenai(
                model
            )
        if "openvino-genai" in args.engines and timed:
            _log(f"model {model.name}: OpenVINO GenAI's export (optimum-intel)")
            record, peer_dirs["openvino-genai"] = export_openvino_genai(
                model, args.openvino_genai_python, BUILD_TIMEOUT_S
            )
            builds["openvino-genai"] = record
            self.watch.sample()
        gguf = find_gguf(artifact) if artifact else None
        loads = self._loads(model, peer_dirs, gguf, builds)

        batch1 = [model.prompt_ids]
        batched = model.prompts(args.batch, PROMPT_LEN)
        if "batch1" in args.parts:
            if model.name == "pydoc-16m":
                spec = {"path": str(model.path), "threads": args.threads}
                out["reference"] = self._decode(model, REFERENCE, spec, batch1, runs=1, warmup=1)
            out["batch1"] = self._decode_rounds(model, loads, batch1)
            _compare_tokens(out["batch1"], out.get("reference"))
        if "batched" in args.parts:
            out["batched"] = self._decode_rounds(model, loads, batched)
        if "context" in args.parts and model.name in args.context_models:
            out["context"] = context_part(self, model, loads)
        if "prefill" in args.parts and model.name in args.prefill_models:
            out["prefill"] = self._prefill(model, artifact)
        if "profile" in args.parts:
            out["profile"] = {
                str(len(prompts)): self._profile(model, artifact, prompts)
                for prompts in (batch1, batched)
            }
        return out

    def artifact_shape(self) -> DecodeArtifact:
        """The ingot row's artifact: blocks of `--ingot-block-size`, a long enough context, and
        the OpenVINO target where this ingot has it, the run times it and the block size is
        the one OpenVINO runs (else the OpenVINO row gets an artifact of its own)."""
        shared = self.args.ingot_block_size == OPENVINO_BLOCK_SIZE and self.openvino_wanted()
        size = self.args.ingot_block_size
        return DecodeArtifact(block_size=size, max_seq_len=CONTEXT_MAX_SEQ_LEN, openvino=shared)

    def openvino_wanted(self) -> bool:
        return "ingot-openvino" in self.args.engines and openvino_available()

    def separate_openvino_artifact(self) -> bool:
        return self.openvino_wanted() and self.args.ingot_block_size != OPENVINO_BLOCK_SIZE

    def _build_ingot(
        self, model: BenchModel, shape: DecodeArtifact, with_interop: bool
    ) -> tuple[str | None, dict[str, Any]]:
        wants_gguf = with_interop and "llama.cpp" in self.args.engines and gguf_available()
        interop = ["gguf"] if wants_gguf else []
        _log(f"model {model.name}: building the ingot artifact ({shape}, interop {interop})")
        spec = build_spec(model, self.tmp, self.args.threads, interop, shape)
        built = self.worker(spec, BUILD_TIMEOUT_S)
        self.watch.sample()
        if not built["ok"]:
            return None, built
        built["graphs"] = artifact_graphs(built["artifact"])
        built["interop_requested"] = interop
        built["shape"] = {"block_size": shape.block_size, "max_seq_len": shape.max_seq_len}
        built["shape"]["openvino"] = shape.openvino
        return built["artifact"], built

    def _build_ortgenai(self, model: BenchModel) -> tuple[dict[str, Any], Path | None]:
        _log(f"model {model.name}: onnxruntime-genai model builder")
        record, out = build_ortgenai(model, self.args.ortgenai_python, BUILD_TIMEOUT_S)
        self.watch.sample()
        if out is not None:
            record |= set_ortgenai_threads(out, self.args.threads)
        return record, out

    def _loads(
        self,
        model: BenchModel,
        peer_dirs: dict[str, Path | None],
        gguf: Path | None,
        builds: dict[str, Any],
    ) -> dict[str, dict[str, Any] | str]:
        """Each engine's load arguments, or why it cannot run (a failed row). Each case adds
        its batch, its token budget and the context each sequence needs (`load_for`)."""
        loads: dict[str, dict[str, Any] | str] = {}
        for engine, name in (("ingot", ORT_ENGINE), ("ingot-openvino", OPENVINO_ENGINE)):
            # Each row's own artifact, else the one both share.
            built = builds.get(engine) or builds["ingot"]
            if not built.get("ok"):
                loads[engine] = f"ingot build failed: {built.get('error')}"
            elif engine == "ingot-openvino" and not built["shape"]["openvino"]:
                loads[engine] = "this ingot has no `openvino` engine target (pipeline/engines)"
            elif built["shape"]["openvino"]:  # two engines: name the one the row runs
                loads[engine] = {"artifact": built["artifact"], "engine": name}
            else:
                loads[engine] = {"artifact": built["artifact"]}
        for peer, key in (("onnxruntime-genai", "model_dir"), ("openvino-genai", "model_dir")):
            if peer_dirs.get(peer) is None:
                failed = builds.get(peer) or {}
                loads[peer] = f"{peer}'s model build failed: {failed.get('error')}"
            else:
                loads[peer] = {key: str(peer_dirs[peer]), "threads": self.args.threads}
                loads[peer] |= {"kv_bytes_per_token": kv_bytes_per_token(model, peer)}
        missing = missing_peer(LLAMA_CPP, LLAMA_CPP_DISTRIBUTION, self.args.llama_cpp_python)
        if missing is not None:
            loads["llama.cpp"] = missing["error"]
        elif gguf is None:
            why = "" if gguf_available() else " (this ingot has no `interop: [gguf]`)"
            loads["llama.cpp"] = f"no GGUF in the ingot artifact{why}"
        else:
            loads["llama.cpp"] = {"gguf": str(gguf), "threads": self.args.threads}
        return loads

    def _decode_rounds(
        self, model: BenchModel, loads: dict[str, dict[str, Any] | str], prompts: list[list[int]]
    ) -> dict[str, dict[str, Any]]:
        """Every engine's case over `--runs` rounds, one timed run per engine per round, in
        turn (harness.rounds); the bandwidth measured after each round bounds that round."""
        engines = list(self.args.engines)
        bandwidths = []

        def after_round(_: int) -> None:
            bandwidths.append(measure_bandwidth(self.args.threads))
            self.watch.sample()

        rounds = interleave(
            engines,
            self.args.runs,
            lambda engine, _: self._decode(model, engine, loads[engine], prompts, runs=1),
            after_round=after_round,
        )
        cases = {e: merge_rounds(rounds[e]) for e in engines}
        for case in cases.values():
            round_bounds(case, [b["bytes_per_s"] for b in bandwidths])
        pair_ratios(cases)
        return cases

    def _decode(
        self,
        model: BenchModel,
        engine: str,
        load: dict[str, Any] | str,
        prompts: list[list[int]],
        runs: int | None = None,
        warmup: int = WARMUP_TOKENS,
    ) -> dict[str, Any]:
        args = self.args
        tokens, batch = args.tokens, len(prompts)
        traffic = self.traffic(model, engine, batch, len(prompts[0]), tokens)
        if isinstance(load, str):
            return {"ok": False, "error": load, "traffic": traffic}
        load = self.load_for(load, prompts, tokens)
        _log(f"model {model.name}: {engine}, {batch} x {tokens} tokens")
        spec = {
            "kind": "decode",
            "engine": engine,
            "load": load,
            "prompts": prompts,
            "tokens": tokens,
            "warmup_tokens": min(warmup, tokens),
            "runs": runs or args.runs,
            "budget_s": DECODE_BUDGET_S,
            "reduced_budget_s": REDUCED_BUDGET_S,
        }
        result = self.worker(spec, WORKER_TIMEOUT_S, self.python(engine))
        result["load_1min_after"] = self.watch.sample()
        result["traffic"] = traffic
        return result

    @staticmethod
    def load_for(load: dict[str, Any], prompts: list[list[int]], tokens: int) -> dict[str, Any]:
        """An engine's load arguments for one case: its batch, the step's token budget (every
        prompt prefilled in one step) and each sequence's context (its prompt and output, rounded
        up to 256: the pools of ingot and llama.cpp, the cache of OpenVINO GenAI)."""
        ctx = -(-(max(map(len, prompts)) + tokens + 1) // 256) * 256
        return load | {
            "batch": len(prompts),
            "batched_tokens": sum(map(len, prompts)),
            "ctx_per_seq": ctx,
        }

    def python(self, engine: str) -> Path | None:
        """The interpreter of `engine`'s worker: a peer's own virtualenv, else this one."""
        return {
            "onnxruntime-genai": self.args.ortgenai_python,
            "openvino-genai": self.args.openvino_genai_python,
            "llama.cpp": self.args.llama_cpp_python,
        }.get(engine)

    def traffic(
        self, model: BenchModel, engine: str, batch: int, prompt_len: int, tokens: int
    ) -> dict[str, Any]:
        cfg = ModelConfig.from_dir(model.path)
        context = mean_decode_context(prompt_len, tokens)
        weights = WEIGHTS[engine]
        return decode_traffic(cfg, weights, weights, context, KV_BYTES[engine], batch)

    def _prefill(self, model: BenchModel, artifact: str | None) -> dict[str, Any]:
        if artifact is None:
            return {"ok": False, "error": "ingot build failed"}
        args = self.args
        many = model.prompts(args.prefill_prompts, args.prefill_len)
        few = many[:PACKED_PROMPTS]
        packed = [t for p in few for t in p][: export_max_seq_len(model, CONTEXT_MAX_SEQ_LEN) - 1]
        cases = [
            {"name": "batched", "prompts": many},
            {"name": "batched", "prompts": few},
            {"name": "packed", "prompts": [packed]},
        ]
        _log(f"model {model.name}: ingot prefill")
        spec = {"kind": "prefill", "artifact": artifact, "cases": cases, "runs": args.runs}
        result = self.worker(spec, WORKER_TIMEOUT_S)
        result["load_1min_after"] = self.watch.sample()
        return result

    def _profile(
        self, model: BenchModel, artifact: str | None, prompts: list[list[int]]
    ) -> dict[str, Any]:
        if artifact is None:
            return {"ok": False, "error": "ingot build failed"}
        _log(f"model {model.name}: ingot under the ONNX Runtime profiler, batch {len(prompts)}")
        spec = {
            "kind": "profile",
            "artifact": artifact,
            "prompts": prompts,
            "tokens": min(self.args.tokens, PROFILE_TOKENS),
            "skip_steps": PROFILE_SKIP_STEPS,
            "prefix": str(self.tmp / f"ort-profile-{model.name}-{len(prompts)}"),
        }
        result = self.worker(spec, WORKER_TIMEOUT_S)
        result["load_1min_after"] = self.watch.sample()
        return result

    def worker(self, spec: dict, timeout_s: float, python: Path | None = None) -> dict:
        """Run one spec in a fresh process; a crash or timeout becomes an error record."""
        started = time.perf_counter()
        try:
            result = run_worker(WORKER, spec, self.tmp, timeout_s, python)
        except WorkerFailed as e:
            return {"ok": False, "error": str(e)}
        result["wall_s"] = time.perf_counter() - started
        return result


def kv_bytes_per_token(model: BenchModel, engine: str) -> int:
    """KV bytes per token of `engine`'s cache (KV_BYTES per element) for `model`."""
    cfg = ModelConfig.from_dir(model.path)
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * KV_BYTES[engine]


def _compare_tokens(cases: dict[str, dict[str, Any]], reference: dict | None) -> None:
    """Greedy agreement with the fp32 IR: how many leading tokens are identical."""
    for case in cases.values():
        if reference is None or not reference.get("ok") or not case.get("ok"):
            case["tokens_match_reference"] = None
            continue
        ours, theirs = case["tokens"][0], reference["tokens"][0]
        same = 0
        for a, b in zip(ours, theirs, strict=False):
            if a != b:
                break
            same += 1
        case["tokens_match_reference"] = {
            "leading_identical": same,
            "of": min(len(ours), len(theirs)),
        }


def _model_summary(model: BenchModel) -> dict[str, Any]:
    cfg = ModelConfig.from_dir(model.path)
    return {
        "path": str(model.path),
        "layers": cfg.num_layers,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
        "tied_embeddings": cfg.tie_word_embeddings,
        "export_max_seq_len": export_max_seq_len(model, CONTEXT_MAX_SEQ_LEN),
        "prompt_tokens": len(model.prompt_ids),
    }


def _report(
    machine: dict,
    bandwidth: list[dict],
    results: dict,
    args: argparse.Namespace,
    watch: LoadWatch,
    refused: str | None,
) -> dict[str, Any]:
    # Each case's bound and fraction came from its rounds' bandwidths (_decode_rounds);
    # the runs before and after all the cases show how far the host's bandwidth moved.
    best = max(bandwidth, key=lambda b: b["bytes_per_s"])
    peers = {
        ORTGENAI: peer_version(args.ortgenai_python, ORTGENAI),
        f"onnxruntime (with {ORTGENAI})": peer_version(args.ortgenai_python, "onnxruntime"),
        OPENVINO_GENAI: peer_version(args.openvino_genai_python, OPENVINO_GENAI),
        f"openvino (with {OPENVINO_GENAI})": peer_version(args.openvino_genai_python, "openvino"),
        LLAMA_CPP_DISTRIBUTION: peer_version(args.llama_cpp_python, LLAMA_CPP_DISTRIBUTION),
        "openvino (ingot-openvino)": peer_version(Path(sys.executable), "openvino"),
    }
    return {
        "benchmark": "decode",
        "refused": refused,
        "settings": {
            "models": args.models,
            "engines": args.engines,
            "parts": args.parts,
            "greedy": True,
            "ignore_eos": True,
            "new_tokens": args.tokens,
            "prompt_tokens": PROMPT_LEN,
            "batch": args.batch,
            "warmup_tokens": min(WARMUP_TOKENS, args.tokens),
            "runs": args.runs,
            "rounds": "interleaved: one timed run per engine per round, engines in turn",
            "statistic": "median",
            "decode_budget_s": DECODE_BUDGET_S,
            "reduced_budget_s": REDUCED_BUDGET_S,
            "threads": args.threads,
            "weights": "RTN int4 g32 symmetric, lm_head included",
            "matmul_accuracy_level": MATMUL_ACCURACY_LEVEL,
            "kv_bytes_per_element": KV_BYTES,
            "kv_block_size": args.ingot_block_size,
            "openvino_kv_block_size": OPENVINO_BLOCK_SIZE,
            "context": {
                "models": args.context_models,
                "prompt_tokens": args.contexts,
                "new_tokens": args.context_tokens,
                "runs": args.context_runs,
            },
            "openvino_engine_override": OPENVINO_ENGINE,
            "prefill": {
                "models": args.prefill_models,
                "prompts": args.prefill_prompts,
                "tokens_per_prompt": args.prefill_len,
                "packed_prompts": PACKED_PROMPTS,
            },
            "profile": {"tokens": min(args.tokens, PROFILE_TOKENS), "skip": PROFILE_SKIP_STEPS},
            "quick": args.quick,
        },
        "machine": machine | {"peer_versions": peers},
        "bandwidth": {"runs": bandwidth, "bytes_per_s": best["bytes_per_s"]},
        "host_load": watch.record(),
        "results": results,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per sequence")
    parser.add_argument("--batch", type=int, default=32, help="sequences decoding together")
    parser.add_argument(
        "--runs", type=int, default=3, help="interleaved rounds: one timed run per engine each"
    )
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument(
        "--contexts",
        default="32,1024,2048,4096",
        help=f"the context part's prompt lengths (tokens; at most {CONTEXT_MAX_SEQ_LEN} less "
        "its new tokens)",
    )
    parser.add_argument(
        "--context-models", default="llama-1b-shape", help="models of the context part"
    )
    parser.add_argument(
        "--context-tokens", type=int, default=32, help="new tokens after each context prompt"
    )
    parser.add_argument(
        "--context-runs", type=int, default=1, help="interleaved rounds of the context part"
    )
    parser.add_argument(
        "--ingot-block-size",
        type=int,
        default=32,
        help="KV block size of the ingot row's artifact: 32 (the default) shares one artifact "
        "with ingot-openvino, another size builds one artifact per row",
    )
    parser.add_argument("--prefill-models", default="pydoc-16m", help="models of the prefill part")
    parser.add_argument("--prefill-prompts", type=int, default=32)
    parser.add_argument("--prefill-len", type=int, default=256, help="tokens per prefill prompt")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: pydoc-16m, 16 tokens, batch 4, 1 run, small prefill; to a temp dir",
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
        help="directory holding pydoc-16m (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        metavar="FILE",
        help="text of pydoc-16m's batched and prefill prompts (default: %(default)s)",
    )
    for peer, flag in (
        (ORTGENAI, "--ortgenai-python"),
        (OPENVINO_GENAI, "--openvino-genai-python"),
        (LLAMA_CPP, "--llama-cpp-python"),
    ):
        parser.add_argument(
            flag,
            type=Path,
            default=peer_python(peer),
            metavar="PATH",
            help=f"{peer}'s interpreter (default: %(default)s, made by "
            f"benchmarks/peers/setup.sh {peer})",
        )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="intra-op threads of every engine and of the bandwidth probe (default: %(default)s)",
    )
    parser.add_argument("--out-dir", type=Path, default=None, metavar="DIR")
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.models = "pydoc-16m"
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "ingot-decode-quick"
        args.out_dir = quick_dir if args.quick else RESULTS
    for name, known in (("models", MODELS), ("engines", ENGINES), ("parts", PARTS)):
        values = getattr(args, name).split(",")
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"--{name}: unknown {unknown} (known: {', '.join(known)})")
        setattr(args, name, values)
    args.prefill_models = args.prefill_models.split(",")
    args.context_models = args.context_models.split(",")
    args.contexts = sorted(int(n) for n in str(args.contexts).split(","))
    if args.contexts[-1] + args.context_tokens + 1 > CONTEXT_MAX_SEQ_LEN:
        parser.error(
            f"--contexts: the longest prompt and its new tokens pass {CONTEXT_MAX_SEQ_LEN}"
        )
    return args


def _log(message: str) -> None:
    print(f"[decode] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
