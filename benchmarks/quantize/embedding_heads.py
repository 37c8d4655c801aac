"""What quantizing the embedding and lm_head buys and costs: artifact bytes, perplexity and
batch-1 decode speed on the ONNX Runtime engine, per scheme.

    .venv/bin/python -m benchmarks.quantize.embedding_heads [--models pydoc-16m,pydoc-tiny]
        [--threads N] [--max-windows N] [--rounds N] [--tokens N]
        [--out-dir benchmarks/results] [--report-only]

- Models: ../shared/models/pydoc-16m (untied, vocab 4096 x 384) and pydoc-tiny (tied, 4096 x
  256; the demo model). Text: ../shared/data/pydoc-eval.txt cut into windows of 256 tokens.
- Every configuration is an `ingot build` (RTN int4 g32 symmetric decoder layers, the default
  ONNX Runtime target: MatMulNBits at accuracy level 4) with an `evaluate` section; the
  embedding and lm_head: fp32; int8 per row (the >= 1B default); int8 in groups of 32; and,
  untied only, the embedding int8 per row with lm_head int4 g32. "IR" is the quantized IR in
  PyTorch, "engine" the built engine as the runtime runs it; "cost" the build report's
  `embedding_lm_head` (the IR minus the IR with a float embedding and lm_head).
- int4 g32 for both (what onnxruntime-genai writes) is not exportable here (ONNX's Gather takes
  no 4-bit tensors): its row scores the fp32 build's IR with both tables RTN int4 g32 in
  PyTorch, and its bytes are counted, not built.
- Bytes: the portable graph's data file and the engine's, and the embedding / lm_head
  initializers' share of the portable one (each stored byte range once).
- Decode: tokens per second of one sequence (a 16-token prompt, then --tokens greedy tokens,
  prefill excluded: the time of --tokens tokens minus that of one), each artifact in a fresh
  process, every configuration once per round in a rotating order (harness/rounds.py), the
  median of the rounds. A loaded host refuses the report (harness LoadWatch); --rounds 0
  measures bytes and perplexity only, which a loaded host does not change.

Writes benchmarks/results/embedding_heads.json and embedding_heads.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import run_worker, worker_main
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave

LAYERS = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
_BOTH = {"targets": ["embed_tokens", "lm_head"], "ignore": []}
_INT8 = {"method": "rtn", "bits": 8, "symmetric": True}
# label -> the quantize entries after LAYERS, and whether a tied model can have them
CONFIGS: dict[str, tuple[list[dict[str, Any]], bool]] = {
    "fp32": ([], True),
    "int8 per row": ([{**_INT8, "group_size": -1, **_BOTH}], True),
    "int8 g32": ([{**_INT8, "group_size": 32, **_BOTH}], True),
    "embedding int8 per row, lm_head int4 g32": (
        [
            {**_INT8, "group_size": -1, "targets": ["embed_tokens"]},
            {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["lm_head"], "ignore": []},
        ],
        False,
    ),
}
INT4_IR_ONLY = "int4 g32 (IR only: not exportable)"
_MODULE = "benchmarks.quantize.embedding_heads"  # the decode worker's (run as -m)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, args.report_name, _markdown)
    watch = LoadWatch(args.threads, timed=args.rounds > 0)  # --rounds 0: no decode timing
    report: dict[str, Any] = {
        "machine": machine_info(),
        "settings": {k: v for k, v in vars(args).items() if k in _SETTINGS},
        "rows": [],
    }
    report["settings"]["eval_text"] = str(args.eval_text)
    with tempfile.TemporaryDirectory(prefix="ingot-heads-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        for model in args.models:
            checkpoint = args.models_dir / model
            tied = json.loads((checkpoint / "config.json").read_text())["tie_word_embeddings"]
            built = {}
            for label, (entries, tied_ok) in CONFIGS.items():
                if tied and not tied_ok:
                    continue
                built[label] = _build(work, checkpoint, label, entries, args)
                watch.sample()
                _log(f"{model}: {label}: {built[label]['row']}")
            report["rows"] += [b["row"] for b in built.values()]
            report["rows"].append(_int4_ir_only(built["fp32"], checkpoint, args))
            speeds = interleave(
                list(built),
                args.rounds,
                lambda label, _i, built=built: _decode(work, built[label]["artifact"], args),
                after_case=watch.sample,
            )
            for label, values in speeds.items():
                built[label]["row"]["decode_tok_s"] = [round(v, 2) for v in values]
    report["host_load"] = watch.record()
    report["refused"] = watch.refusal()
    return publish(report, args.out_dir, args.report_name, _markdown)


_SETTINGS = ("seq_len", "max_windows", "threads", "rounds", "tokens")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="pydoc-16m,pydoc-tiny", type=lambda s: s.split(","),
        help="checkpoints under ../shared/models (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--models-dir", type=Path, default=models_dir())
    parser.add_argument("--eval-text", type=Path, default=data_dir() / "pydoc-eval.txt")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=None, help="default: every window")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3, help="decode rounds; 0: none")
    parser.add_argument("--tokens", type=int, default=128, help="greedy tokens per decode run")
    parser.add_argument("--report-name", default="embedding_heads")
    parser.add_argument("--work-dir", type=Path, default=None, help="where builds are written")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def _build(
    work: Path, checkpoint: Path, label: str, entries: list[dict], args: argparse.Namespace
) -> dict[str, Any]:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    perplexity = {"dataset": str(args.eval_text), "seq_len": args.seq_len}
    if args.max_windows is not None:
        perplexity["max_windows"] = args.max_windows
    recipe = {
        "source": {"path": str(checkpoint)},
        "quantize": [LAYERS, *entries],
        "embedding_and_lm_head": "float",  # the configurations say it
        "kv_cache": {"dtype": "fp32", "block_size": 16},
        "export": {"max_seq_len": 1024},
        "targets": [{"engine": "onnxruntime", "intra_op_num_threads": args.threads}],
        "evaluate": {"perplexity": perplexity},
        "artifact": {"name": checkpoint.name},
    }
    job = work / f"{checkpoint.name}-{len(list(work.glob('*.json')))}"
    job.with_suffix(".json").write_text(json.dumps(recipe))  # JSON is YAML
    result = build(job.with_suffix(".json"), job, cache=StageCache(work / "cache"))
    artifact = result.artifact
    ppl = json.loads((artifact / "eval" / "report.json").read_text())["perplexity"]
    heads = ppl.get("embedding_lm_head")
    row = {
        "model": checkpoint.name,
        "config": label,
        **{k: ppl[k] for k in ("windows", "original", "quantized", "engine")},
        "cost": heads["cost"] if heads else 0.0,
        "portable_bytes": (artifact / "model.onnx.data").stat().st_size,
        "engine_bytes": sum(p.stat().st_size for p in (artifact / "engines").rglob("*.data")),
        "artifact_bytes": sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file()),
        "table_bytes": _table_bytes(artifact / "model.onnx"),
    }
    quantize = next(r for r in result.stages if r.stage == "quantize")
    ir = StageCache(work / "cache").get("quantize", quantize.key)  # this build's IR
    return {"row": row, "artifact": artifact, "ir": ir, "recipe": job.with_suffix(".json")}


def _table_bytes(graph: Path) -> int:
    """Bytes of the embedding's and lm_head's initializers in the graph's data file, each
    stored range counted once (a tied table's names share one)."""
    import onnx

    spans = set()
    for init in onnx.load(str(graph), load_external_data=False).graph.initializer:
        if init.name.startswith(("embed_tokens", "lm_head")):
            data = {e.key: e.value for e in init.external_data}
            spans.add((int(data["offset"]), int(data["length"])))
    return sum(length for _, length in spans)


def _int4_ir_only(fp32: dict[str, Any], checkpoint: Path, args: argparse.Namespace) -> dict:
    """The fp32 build's IR with the embedding and lm_head RTN int4 g32, scored in PyTorch;
    the tables' bytes as the graph would store them (codes + fp32 scales), not built."""
    import torch

    from ingot.pipeline.evaluate.perplexity import perplexity
    from ingot.pipeline.evaluate.windows import eval_windows
    from ingot.pipeline.model.qembedding import QuantizedEmbedding
    from ingot.pipeline.quantize.checkpoint import load_ir
    from ingot.pipeline.quantize.rtn import quantize_linear_rtn
    from ingot.pipeline.recipe import load_recipe

    torch.set_num_threads(args.threads)
    model = load_ir(fp32["ir"])
    table = torch.nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
    table.weight = model.embed_tokens.weight
    model.embed_tokens = QuantizedEmbedding.of(quantize_linear_rtn(table, 4, 32, True))
    if model.cfg.tie_word_embeddings:
        model.tie_lm_head()
    else:
        model.lm_head = quantize_linear_rtn(model.lm_head, 4, 32, True)
    recipe = fp32["recipe"]
    windows = eval_windows(load_recipe(recipe), recipe, checkpoint).windows  # the builds'
    with torch.inference_mode():
        quantized = perplexity(model, windows)
    v, h = model.cfg.vocab_size, model.cfg.hidden_size
    tables = 1 if model.cfg.tie_word_embeddings else 2
    base = fp32["row"]
    return {
        "model": base["model"],
        "config": INT4_IR_ONLY,
        "windows": base["windows"],
        "original": base["original"],
        "quantized": round(quantized, 6),
        "engine": None,
        "cost": round(quantized - base["quantized"], 6),
        "table_bytes": tables * (v * h // 2 + 4 * v * h // 32),
        "portable_bytes": None,
        "engine_bytes": None,
        "artifact_bytes": None,
    }


def _decode(work: Path, artifact: Path, args: argparse.Namespace) -> float:
    spec = {"artifact": str(artifact), "tokens": args.tokens, "threads": args.threads}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        return run_worker(_MODULE, spec, Path(tmp), timeout_s=600)["tok_s"]


def _run_decode(spec: dict[str, Any]) -> dict[str, Any]:
    """One artifact's batch-1 greedy decode speed, in this (fresh) process."""
    from ingot.runtime import LoadedModel, SamplingParams

    generator = LoadedModel.load(spec["artifact"]).generator()
    prompt = [[0, *range(100, 115)]]  # 16 tokens

    def seconds(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        generator.generate(prompt, params)
        return time.perf_counter() - started

    seconds(8)  # warm up: sessions, arenas
    one = statistics.median(seconds(1) for _ in range(3))
    many = seconds(spec["tokens"])
    return {"tok_s": (spec["tokens"] - 1) / (many - one)}


def _markdown(report: dict[str, Any]) -> str:
    settings, machine, rows = report["settings"], report["machine"], report["rows"]
    lines = ["# The embedding and lm_head quantized: bytes, perplexity, decode", ""]
    windows = rows[0]["windows"] if rows else 0
    lines += [
        f"Text: `{settings['eval_text']}`, {windows} windows of {settings['seq_len']} tokens. "
        "Decoder layers RTN int4 g32 in every row; the default ONNX Runtime target (MatMulNBits, "
        "int8 activations). IR: PyTorch; engine: the built engine through the runtime; cost: "
        "the IR minus the IR with a float embedding and lm_head (the build's eval report).",
        "",
        f"Host: {machine['cpu_model']}, {machine['usable_cores']} cores, "
        f"{settings['threads']} threads; onnxruntime {machine['versions']['onnxruntime']}; "
        f"{machine['date']}. Host load (1 min): "
        + ", ".join(f"{v:.1f}" for v in report["host_load"]["load_1min_samples"])
        + ".",
        "",
        "| model | embedding / lm_head | IR | engine | cost | tables MiB | portable MiB | "
        f"engine MiB | decode tok/s ({_rounds(settings['rounds'])}) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speeds = r.get("decode_tok_s")
        lines.append(
            f"| {r['model']} | {r['config']} | {r['quantized']:.4f} | "
            f"{_num(r['engine'], '.4f')} | {r['cost']:+.4f} | {r['table_bytes'] / 2**20:.2f} | "
            f"{_mib(r['portable_bytes'])} | {_mib(r['engine_bytes'])} | "
            f"{_num(statistics.median(speeds) if speeds else None, '.1f')} |"
        )
    lines += [
        "",
        "tables MiB: the embedding's and lm_head's initializers in the portable graph (a tied "
        "table once); portable / engine MiB: model.onnx.data of the portable graph and of the "
        "engine (ONNX Runtime's engine keeps its own copy: MatMulNBits' blocks beside the "
        "gather's codes). The int4 row's bytes are counted (codes + fp32 scales), not built.",
        "",
    ]
    return "\n".join(lines)


def _rounds(rounds: int) -> str:
    return f"median of {rounds} rounds" if rounds else "not measured: --rounds 0"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.2f}"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1].endswith(".json"):
        worker_main(_run_decode)
    else:
        sys.exit(main())
