"""Batch-1 decode of a mixture of experts against a dense model of the same active parameters,
and against llama.cpp on the same Q4_0 weights.

Reproduce (alone on a quiet machine; about 10 minutes on 2 cores, the first run also builds the
checkpoints and artifacts into the benchmark cache; writes benchmarks/results/moe_decode.json
and moe_decode.md):

    .venv/bin/python -m benchmarks.decode.moe_decode [--rounds 5] [--tokens 512]
        [--threads 2] [--gguf PATH] [--llama-cpp-python PATH] [--wait-idle SECONDS] [--quick]
        [--report-only]

The models (random weights, seed 0, bf16, built by transformers from a config; no download):

- moe: the Qwen3-MoE shape of the issue: width 1024, 8 layers, 8 experts of width 768 per
  layer, 2 chosen per token (renormalised), 16 query / 8 KV heads of 64 (q/k norms),
  vocabulary 32000, lm_head untied; `--moe-type mixtral` for Mixtral's layer instead;
- dense: the same model with one MLP of width 1536 = 2 x 768 in place of the experts (Qwen3;
  Llama for Mixtral): the same active parameters per token (the router's 8 x 1024 aside).

Both built by `ingot build` with one recipe: RTN int4 g32 symmetric on every linear, lm_head
included (the router stays float); ONNX Runtime CPU at level `extended`, MatMulNBits accuracy
level 4, --threads threads; the MoE blocks run as ORT's QMoE (engines/onnxruntime/qmoe.py).
llama.cpp (benchmarks/.venvs/llama-cpp) runs the GGUF each artifact's `interop: [gguf]` writes
(Q4_0: the same int4 g32 symmetric codes; the MoE one's experts stacked, moe's interop), or
`--gguf PATH` for the MoE model; without one its row says why. llama.cpp-dense says how far
the dense model itself is from llama.cpp, so the MoE's own gap reads apart from ingot's
batch-1 gap (benchmarks/results/decode.md, batch1_gap.md). Per round each engine decodes
--tokens new tokens after a 32-token prompt in a fresh worker (benchmarks/decode/engines.py,
the decode benchmark's), order rotated per round; tok/s counts decode steps only; ratios are
medians of the rounds' paired ratios. The builds are not timed; from the first decode on, the
host's load is sampled between cases, and a run above the thread count + 1 is written
REFUSED.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.decode.artifact import WORKER, ingot_code_fingerprint
from benchmarks.decode.models import PROMPT_LEN, BenchModel, write_bytelevel_tokenizer
from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, wait_idle
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, bench_cache_dir, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "moe_decode"
COMMON = dict(
    vocab_size=32000,
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=False,
    bos_token_id=31998,
    eos_token_id=31999,
)
EXPERT_WIDTH, EXPERTS, TOP_K = 768, 8, 2
MOE_CONFIGS = {  # model_type -> its config's expert fields
    "mixtral": dict(
        intermediate_size=EXPERT_WIDTH, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K
    ),
    "qwen3_moe": dict(
        moe_intermediate_size=EXPERT_WIDTH,
        intermediate_size=TOP_K * EXPERT_WIDTH,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
}
# The dense counterpart of each MoE family: its attention, one MLP of the active width.
DENSE = {"mixtral": "llama", "qwen3_moe": "qwen3"}
RECIPE_QUANTIZE = [
    {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": []},
]
ENGINES = ("moe", "dense", "llama.cpp-moe", "llama.cpp-dense")
KERNELS = ("QMoE", "MatMulNBits", "MatMul", "TopK", "ScatterND")
BUILD_TIMEOUT_S, RUN_TIMEOUT_S = 3600, 900
QUICK = {"rounds": 1, "tokens": 16}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    with tempfile.TemporaryDirectory(prefix="ingot-moe-") as tmp:
        models = {
            "moe": _checkpoint(args.moe_type, MOE_CONFIGS[args.moe_type]),
            "dense": _checkpoint(
                DENSE[args.moe_type], dict(intermediate_size=TOP_K * EXPERT_WIDTH)
            ),
        }
        builds = {name: _build(args, name, model, Path(tmp)) for name, model in models.items()}
        loads = _loads(args, builds)
        # The builds are not timed: the load is watched from the quiet start of the decodes.
        idle_s = wait_idle(args.wait_idle, _log)
        watch = LoadWatch(args.threads)
        rounds = _rounds(args, models["moe"], loads, Path(tmp), watch)
    report = {
        "machine": machine_info(),
        "load": watch.record() | {"idle_wait_s": idle_s},
        "refused": watch.refusal(),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("out_dir", "report_only")
        },
        "models": {name: _describe(model) for name, model in models.items()},
        "builds": builds,
        "loads": {k: v if isinstance(v, str) else "ok" for k, v in loads.items()},
        "rounds": rounds,
        "summary": _summary(rounds),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _checkpoint(model_type: str, fields: dict[str, Any]) -> BenchModel:
    """The random checkpoint of `model_type` (cached by its config), and its prompt."""
    import hashlib

    config = {**COMMON, **fields}
    digest = hashlib.sha256(json.dumps([model_type, config, "bytelevel"], sort_keys=True).encode())
    path = bench_cache_dir() / f"moe-bench-{model_type}-{digest.hexdigest()[:8]}"
    if not (path / ".complete").exists():
        _log(f"building the random {model_type} checkpoint at {path}")
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
        model.to(torch.bfloat16).save_pretrained(path)
        write_bytelevel_tokenizer(path, config)  # what ingot's GGUF writer takes
        (path / ".complete").write_text("")
    bos = config["bos_token_id"]
    prompt = BenchModel(model_type, path, (), bos, bos).prompts(1, PROMPT_LEN)[0]
    return BenchModel(model_type, path, tuple(prompt), bos, bos)


def _build(args, name: str, model: BenchModel, tmp: Path) -> dict[str, Any]:
    """`ingot build` of `model` (with `interop: [gguf]` for the MoE, retried without where
    this ingot cannot write it); the artifact, its engine's kernels, or the error."""
    attempts = [["gguf"], []] if name == "dense" or args.gguf is None else [[]]
    errors = []
    for interop in attempts:
        recipe = {
            "source": {"path": str(model.path)},
            "quantize": RECIPE_QUANTIZE,
            "kv_cache": {"dtype": "fp32", "block_size": 16},
            "export": {"max_seq_len": 1024},
            "targets": [
                {
                    "engine": "onnxruntime",
                    "optimization_level": "extended",
                    "intra_op_num_threads": args.threads,
                    "matmul_accuracy_level": 4,
                }
            ],
            "interop": interop,
            "artifact": {"name": f"moe-bench-{name}"},
        }
        path = tmp / f"{name}.yaml"
        path.write_text(json.dumps(recipe, indent=2))
        out = bench_cache_dir() / "moe-artifacts" / f"{name}{'-gguf' if interop else ''}"
        spec = {
            "kind": "build",
            "recipe": str(path),
            "out": str(out),
            "cache": str(bench_cache_dir() / "stage-cache" / ingot_code_fingerprint()),
        }
        _log(f"{name}: ingot build (interop {interop})")
        try:
            built = run_worker(WORKER, spec, tmp, BUILD_TIMEOUT_S)
        except WorkerFailed as e:
            built = {"ok": False, "error": str(e)}
        if built["ok"]:
            return (
                {"artifact": built["artifact"], "seconds": built["seconds"]}
                | _engine(Path(built["artifact"]))
                | ({"gguf_error": errors[0]} if errors else {})
            )
        errors.append(str(built["error"]).strip().splitlines()[-1][:300])
    return {"error": errors[-1]}


def _engine(artifact: Path) -> dict[str, Any]:
    """The kernels of the engine's optimized graph, and the GGUF the build wrote (if any)."""
    import onnx

    manifest = json.loads((artifact / "manifest.json").read_text())
    path = artifact / manifest["engines"][0]["path"]
    ops = Counter(n.op_type for n in onnx.load(path, load_external_data=False).graph.node)
    gguf = next(iter(sorted(artifact.rglob("*.gguf"))), None)
    kernels = {k: ops[k] for k in KERNELS if ops[k]}
    return {"kernels": kernels, "gguf": str(gguf) if gguf else None}


def _loads(args, builds: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | str]:
    """Each engine's worker load, or why it does not run."""
    loads: dict[str, dict[str, Any] | str] = {}
    for name, built in builds.items():
        if "error" in built:
            loads[name] = f"build failed: {built['error']}"
        else:
            loads[name] = {"artifact": built["artifact"], "batch": 1, "batched_tokens": 64}
    for name in ("moe", "dense"):
        gguf = (args.gguf if name == "moe" else None) or builds[name].get("gguf")
        python = args.llama_cpp_python
        if not python.exists():
            why = f"no llama.cpp environment ({python}: benchmarks/peers/setup.sh)"
        elif gguf is None:
            why = f"no GGUF of the {name} model: {builds[name].get('gguf_error', 'no GGUF')}"
        else:
            why = None
        loads[f"llama.cpp-{name}"] = why or {
            "gguf": str(gguf),
            "threads": args.threads,
            "batch": 1,
            "batched_tokens": 64,
            "ctx_per_seq": PROMPT_LEN + args.tokens + 8,
        }
    return loads


def _rounds(args, model: BenchModel, loads, tmp: Path, watch: LoadWatch) -> list[dict]:
    """Per round, each engine's decode tok/s (order rotated per round)."""
    engines = [e for e, load in loads.items() if not isinstance(load, str)]
    rounds = []
    for r in range(args.rounds):
        result: dict[str, Any] = {}
        for engine in engines[r % len(engines) :] + engines[: r % len(engines)]:
            _log(f"round {r + 1}: {engine}, {args.tokens} tokens")
            llama = engine.startswith("llama.cpp")
            spec = {
                "kind": "decode",
                "engine": "llama.cpp" if llama else "ingot",
                "load": loads[engine],
                "prompts": [list(model.prompt_ids)],
                "tokens": args.tokens,
                "warmup_tokens": min(8, args.tokens),
                "runs": 1,
                "budget_s": 300,
                "reduced_budget_s": 90,
            }
            python = args.llama_cpp_python if llama else None
            try:
                out = run_worker(WORKER, spec, tmp, RUN_TIMEOUT_S, python=python)
                result[engine] = {"tokens_per_s": out.get("tokens_per_s")}
            except WorkerFailed as e:
                result[engine] = {"error": str(e)[-300:]}
            result[f"load_after_{engine}"] = watch.sample()
        rounds.append(result)
    return rounds


def _summary(rounds: list[dict]) -> dict[str, Any]:
    """Median tok/s per engine; the median paired ratios moe / each other engine, and dense /
    llama.cpp-dense (how far the dense model itself is from llama.cpp)."""
    summary: dict[str, Any] = {}
    for engine in ENGINES:
        rates = [r[engine].get("tokens_per_s") for r in rounds if engine in r]
        if rates and all(rates):
            summary[f"{engine}_tokens_per_s"] = statistics.median(rates)
    pairs = [("moe", e) for e in ENGINES[1:]] + [("dense", "llama.cpp-dense")]
    for ours, other in pairs:
        ratios = [
            r[ours]["tokens_per_s"] / r[other]["tokens_per_s"]
            for r in rounds
            if r.get(ours, {}).get("tokens_per_s") and r.get(other, {}).get("tokens_per_s")
        ]
        if ratios:
            summary[f"{ours}_over_{other}"] = statistics.median(ratios)
            summary[f"{ours}_over_{other}_range"] = [min(ratios), max(ratios)]
    return summary


def _describe(model: BenchModel) -> dict[str, Any]:
    config = json.loads((model.path / "config.json").read_text())
    return {"model_type": config["model_type"], "checkpoint": model.path.name}


def _markdown(report: dict[str, Any]) -> str:
    s, summary, m = report["settings"], report["summary"], report["machine"]
    lines = [
        "# Mixture of experts: batch-1 decode against dense and llama.cpp",
        "",
        f"{m.get('cpu_model', '?')}, {s['threads']} threads; load samples "
        f"{report['load'].get('load_1min_samples')}"
        + (f"; **REFUSED: {report['refused']}**" if report.get("refused") else "")
        + f". Batch 1, a {PROMPT_LEN}-token prompt then {s['tokens']} new tokens (greedy), "
        f"{s['rounds']} interleaved round(s); tok/s counts decode steps; ratios are medians of "
        "the rounds' paired ratios (range in brackets). Weights: RTN int4 g32 symmetric on "
        "every linear and lm_head (router float), MatMulNBits / QMoE accuracy level 4 (int8 "
        "activations); llama.cpp: Q4_0. `python -m benchmarks.decode.moe_decode`",
        "",
        f"moe: {report['models']['moe']['model_type']} of the Qwen3-MoE shape (width 1024, "
        f"8 layers, {EXPERTS} experts of {EXPERT_WIDTH}, top-{TOP_K}); dense: "
        f"{report['models']['dense']['model_type']}, the same with one MLP of "
        f"{TOP_K * EXPERT_WIDTH} (the same active parameters).",
        "",
        "| engine | tok/s | moe / engine | dense / engine | kernels of the engine's graph |",
        "|---|---:|---:|---:|---|",
    ]
    for engine in ENGINES:
        load = report["loads"].get(engine, "not run")
        if load != "ok":
            lines.append(f"| {engine} | {load} | | | |")
            continue
        kernels = report["builds"].get(engine, {}).get("kernels")
        kernel_cell = ", ".join(f"{k} {v}" for k, v in kernels.items()) if kernels else ""
        cells = [_ratio(summary, ours, engine) for ours in ("moe", "dense")]
        rate = summary.get(f"{engine}_tokens_per_s")
        lines.append(f"| {engine} | {_f(rate)} | {cells[0]} | {cells[1]} | {kernel_cell} |")
    return "\n".join(lines) + "\n"


def _ratio(summary: dict[str, Any], ours: str, engine: str) -> str:
    ratio = summary.get(f"{ours}_over_{engine}")
    if ratio is None:
        return ""
    low, high = summary[f"{ours}_over_{engine}_range"]
    return f"{ratio:.2f} ({low:.2f}–{high:.2f})"


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moe-type", default="qwen3_moe", choices=sorted(MOE_CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512, help="new tokens per decode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", type=Path, default=None, help="the MoE model as Q4_0 GGUF")
    parser.add_argument(
        "--llama-cpp-python", type=Path, default=peer_python("llama-cpp"), help="its venv's python"
    )
    parser.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--quick", action="store_true", help="smoke run, to a temp dir")
    parser.add_argument("--out-dir", type=Path, default=None)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.out_dir is None:
        args.out_dir = Path(tempfile.gettempdir()) / "ingot-moe" if args.quick else RESULTS
    return args


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
