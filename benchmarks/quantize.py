"""Weight quantization quality, speed and memory: ingot's RTN / GPTQ / AWQ against
llm-compressor's RTN / GPTQ, side by side, on the same calibration windows and the same
perplexity windows.

    python benchmarks/quantize.py                      # full run (about an hour on 2 cores)
    python benchmarks/quantize.py --samples 8 --max-windows 16 --settings w4g128   # smoke
    python benchmarks/quantize.py --reuse --redo ingot-gptq,ingot-awq   # rerun some rows

- Model: ../shared/models/pydoc-16m (8 layers, width 384; --model). Calibration: 128 windows of
  512 tokens drawn from ../shared/data/pydoc-calib.txt (--calib-text) by ingot's own calibration
  sampler (seed 0); llm-compressor gets the very same token windows (a .npy file). Perplexity
  on two texts, each as consecutive 256-token windows scored by ingot's evaluate stage code on
  ingot's fp32 model for every row: ../shared/data/pydoc-eval.txt (--eval-text), Python
  documentation held out of training (in-distribution), and an out-of-domain text
  (--ood-text): legal prose, the licence texts Debian ships in /usr/share/common-licenses,
  which neither pydoc model saw (fp32 perplexity ~3.5x the in-domain one); each file's sha256
  is in the report. Paths are relative to the repository root; every process runs torch on
  --threads threads.
- Settings: W4 g32, W4 g128, W4 per-channel, W3 g128. ingot's recipe allows bits 4 | 8, so W3
  runs through the Python API of the quantizers (which take any bit width), not a recipe.
- Each quantization runs in its own process; its peak RSS is `getrusage(RUSAGE_CHILDREN)` of a
  small wrapper process that runs only it. "quantize s" is the time of the quantization call
  itself: ingot's `quantize_layers` (layer-sequential from disk, writing the IR) or
  `quantize_model` (RTN, in memory); llm-compressor's `oneshot` (model already loaded, not
  saving). llm-compressor runs in its own virtualenv (--llmc-python, default
  benchmarks/.venvs/llmcompressor/bin/python, made by `benchmarks/peers/setup.sh llmcompressor`)
  through benchmarks/quantize_llmc.py; its compressed-tensors checkpoint is loaded back through
  transformers (decompressed) and scored by ingot's harness.
- Memory vs depth: ingot GPTQ W4 g128 on pydoc-16m (8 layers) and on a random model of its
  width with 16 layers (--depth-control adds a random 8-layer one): the peak should grow by
  less than 10% when the model is made twice as deep, since one layer plus the activations is
  resident at a time. Each depth job runs --depth-repeats times (3) and the medians are
  compared: the same job's peak varies by about +-5% from run to run (glibc's allocator).

Writes benchmarks/results/quantize.json and quantize.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sibling helper modules; benchmarks/ is not a package

from paths import REPO, data_dir, models_dir, peer_python, portable, portable_report  # noqa: E402

LLMC = "llmcompressor"  # the peer: benchmarks/peers/llmcompressor.txt

SETTINGS = {  # name -> (bits, group_size)
    "w4g32": (4, 32),
    "w4g128": (4, 128),
    "w4pc": (4, -1),
    "w3g128": (3, 128),
}
# The out-of-domain text: legal prose (Debian's copies of the licences; GPL-2 is left out, as
# LGPL-2.1 repeats much of it), joined by blank lines.
OOD_FILES = tuple(
    Path("/usr/share/common-licenses") / name
    for name in ("GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1")
)
# eval text -> a row's keys: perplexity, and the mean per-token KL(fp32 || quantized) in nats
DOMAINS = {"in": "perplexity", "ood": "perplexity_ood"}
KL = {"in": "kl", "ood": "kl_ood"}

# (row label, tool, method, symmetric)
METHODS = [
    ("ingot RTN (sym)", "ingot", "rtn", True),
    ("ingot RTN (asym)", "ingot", "rtn", False),
    ("ingot GPTQ (sym)", "ingot", "gptq", True),
    ("ingot GPTQ one pass (sym)", "ingot", "gptq-1p", True),
    ("ingot AWQ (asym)", "ingot", "awq", False),
    ("llm-compressor RTN (sym)", "llmc", "rtn", True),
    ("llm-compressor GPTQ (sym)", "llmc", "gptq", True),
]

# Runs a command as the only child of this process, so RUSAGE_CHILDREN is that command's peak.
_MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
code = subprocess.call(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
out = {"returncode": code, "process_seconds": time.perf_counter() - started,
       "peak_rss_bytes": usage.ru_maxrss * 1024}
open(sys.argv[1], "w").write(json.dumps(out))
"""


# -- workers (one quantization per process) -----------------------------------------------------


def _entry(method: str, bits: int, group_size: int, symmetric: bool) -> Any:
    """The row's quantize entry as a recipe holds it, with the recipe's defaults (GPTQ: act
    order with static groups, true-sequential, ...)."""
    from ingot.pipeline.quantize.method import QUANT_METHODS
    from ingot.pipeline.recipe.quantize import quantize_entry

    spec: dict[str, Any] = {
        "method": method.removesuffix("-1p"),
        "bits": bits,
        "group_size": group_size,
        "symmetric": symmetric,
        "targets": ["re:.*"],
        "ignore": ["lm_head"],
    }
    if method == "gptq-1p":  # every group observed in one pass, llm-compressor's order
        spec["true_sequential"] = False
    if bits in (4, 8):
        return quantize_entry(spec)
    # Recipes allow bits 4 | 8 only; the quantizers take any width, so W3 skips validation.
    return QUANT_METHODS.get(spec["method"]).entry.model_construct(**spec)


def _code_digest() -> str:
    """sha256 over ingot's quantization and calibration sources: which code a row measured."""
    import hashlib

    files = sorted([*REPO.glob("pipeline/quantize/*.py"), *REPO.glob("calibration/*.py")])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


def worker(args: argparse.Namespace) -> None:
    """Quantize with ingot and save the IR to args.out; timing to args.result."""
    import torch

    from ingot.calibration.dataset import CalibrationSet
    from ingot.pipeline.model.load import CheckpointReader, load_model
    from ingot.pipeline.quantize.apply import quantize_model
    from ingot.pipeline.quantize.checkpoint import save_ir
    from ingot.pipeline.quantize.driver import quantize_layers

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entry = _entry(args.method, args.bits, args.group_size, not args.asymmetric)
    result: dict[str, Any] = {"tool": "ingot", "code": _code_digest()}
    try:
        if args.method == "rtn":
            model = load_model(args.model)
            started = time.perf_counter()
            quantize_model(model, [entry])
            result["quantize_seconds"] = time.perf_counter() - started
            save_ir(model, out)
        else:
            tokens = np.load(args.tokens)
            calibration = CalibrationSet(tokens, list(range(len(tokens))), "benchmark")
            work = out.parent / (out.name + "-work")
            shutil.rmtree(work, ignore_errors=True)  # finished layers there would be resumed
            work.mkdir()
            started = time.perf_counter()
            quantize_layers(CheckpointReader(Path(args.model)), [entry], out, work, calibration)
            result["quantize_seconds"] = time.perf_counter() - started
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - the benchmark records every failure as such
        import traceback

        result.update(ok=False, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")


# -- orchestration ------------------------------------------------------------------------------


def _measured(cmd: list[str], result_file: Path, log: Path) -> dict[str, Any]:
    usage_file = result_file.with_suffix(".usage.json")
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-c", _MEASURE, str(usage_file), *cmd], stdout=f, stderr=f, check=False
        )
    usage = json.loads(usage_file.read_text())
    if result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        tail = log.read_text()[-2000:]
        result = {"ok": False, "error": f"exit code {usage['returncode']}", "trace": tail}
    return {**result, **usage}


def _calibration_tokens(work: Path, samples: int, model: Path, text: Path, seed: int = 0) -> Path:
    """ingot's calibration sampler over the calibration text, saved for both tools."""
    from ingot.calibration.dataset import load_calibration

    config = json.loads((model / "config.json").read_text())
    section = {
        "dataset": str(text),
        "split": "train",
        "text_field": "text",
        "samples": samples,
        "seq_len": 512,
        "seed": seed,
    }
    calibration = load_calibration(
        section, model / "tokenizer.json", eos_token_id=config["eos_token_id"]
    )
    path = work / (f"calib-{samples}x512.npy" if seed == 0 else f"calib-{samples}x512-s{seed}.npy")
    np.save(path, np.asarray(calibration.tokens, dtype=np.int64))
    return path


def _eval_windows(model: Path, eval_text: Path, max_windows: int | None):
    from ingot.pipeline.evaluate import load_eval_text, token_windows
    from ingot.pipeline.evaluate.perplexity import tokenize

    text = load_eval_text(str(eval_text))
    ids = tokenize(text.text, model / "tokenizer.json")
    return token_windows(ids, 256, max_windows), text.sha256


def _evaluation(eval_text: Path, digest: str, windows: np.ndarray) -> dict[str, Any]:
    """The report's description of the in-domain perplexity windows [W, T]."""
    return {
        "dataset": eval_text.name,
        "text_sha256": digest,
        "seq_len": int(windows.shape[1]),
        "windows": int(windows.shape[0]),
    }


def _ood_windows(model: Path, files: list[Path], max_windows: int | None):
    """The out-of-domain windows: ``files`` (plain text) joined by blank lines; with the
    description the report records (each file's path and sha256, the joined text's)."""
    import hashlib

    from ingot.pipeline.evaluate import token_windows
    from ingot.pipeline.evaluate.perplexity import tokenize

    texts = [f.read_text(encoding="utf-8") for f in files]
    text = "\n\n".join(t.strip("\n") for t in texts)
    ids = tokenize(text, model / "tokenizer.json")
    windows = token_windows(ids, 256, max_windows)
    sha = [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    described = {
        "dataset": "legal prose (licence texts)",
        "files": [{"path": str(f), "sha256": h} for f, h in zip(files, sha, strict=True)],
        "text_sha256": "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokens": len(ids),
        "seq_len": 256,
        "windows": int(windows.shape[0]),
    }
    return windows, described


def _perplexity(
    kind: str, path: Path, windows: dict[str, Any], reference: Any = None
) -> dict[str, float]:
    """{row key: value} on each text's windows (``windows``: domain -> windows): perplexity, by
    ingot's evaluate code, and with the fp32 ``reference`` model the mean KL(fp32 || this
    model) over the same next-token predictions, in nats. Perplexity says how well a model
    predicts the text, which quantization noise can even improve where the float model is
    overconfident (out of domain); the KL says how far its predictions moved from the float
    model's, in either direction."""
    from ingot.pipeline.model.load import load_model
    from ingot.pipeline.quantize.checkpoint import load_ir

    model = load_ir(path) if kind == "ir" else load_model(path)
    scores = {}
    for domain, w in windows.items():
        ppl, kl = _scores(model, w, reference)
        scores[DOMAINS[domain]] = ppl
        if kl is not None:
            scores[KL[domain]] = kl
    return scores


def _scores(model: Any, windows: Any, reference: Any) -> tuple[float, float | None]:
    """(perplexity, mean KL from ``reference`` | None): ingot's `perplexity` runs the model;
    each batch's logits are compared with the reference's on the way."""
    import torch

    from ingot.pipeline.evaluate import perplexity

    kl = [0.0, 0]  # summed in float64, predictions

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor]:
        logits = model(batch)[0]
        if reference is not None:
            logq = torch.log_softmax(logits[:, :-1].float(), -1)
            logp = torch.log_softmax(reference(batch)[0][:, :-1].float(), -1)
            kl[0] += float((logp.exp() * (logp - logq)).sum(dtype=torch.float64))
            kl[1] += logq.shape[0] * logq.shape[1]
        return (logits,)

    ppl = perplexity(forward, windows)
    return ppl, (kl[0] / kl[1] if reference is not None else None)


def _run(
    label: str, tool: str, method: str, symmetric: bool, setting: str, model: Path, ctx: dict
) -> dict[str, Any]:
    bits, group = SETTINGS[setting]
    tag = f"{tool}-{method}-{'sym' if symmetric else 'asym'}-{setting}-{model.name}"
    tag += f"-s{ctx['seed']}" if ctx.get("seed") else ""
    tag += "-mem" if ctx["windows"] is None else ""  # memory-only rows never replace scored ones
    tag += f"-r{ctx['repeat']}" if ctx.get("repeat") else ""
    out, result = ctx["work"] / tag, ctx["work"] / f"{tag}.json"
    common = ["--model", str(model), "--tokens", str(ctx["tokens"]), "--method", method]
    common += ["--bits", str(bits), "--group-size", str(group), "--out", str(out)]
    common += ["--result", str(result)] + ([] if symmetric else ["--asymmetric"])
    common += ["--threads", str(ctx["threads"])]
    if tool == "ingot":
        cmd = [sys.executable, str(Path(__file__).resolve()), "worker", *common]
    else:
        cmd = [str(ctx["llmc_python"]), str(HERE / "quantize_llmc.py"), *common]
    saved = ctx["work"] / f"{tag}.row.json"
    kind, path = ("ir", out) if tool == "ingot" else ("dense", out / "dense")
    row = None
    if ctx["reuse"] and saved.exists() and f"{tool}-{method}" not in ctx["redo"]:
        row = json.loads(saved.read_text())
        scored = {*DOMAINS.values(), *KL.values()} <= row.keys()
        if row.get("ok") and (ctx["windows"] is None or scored):
            print(f"[reused] {label} {setting} on {model.name}: {_brief(row)}", flush=True)
            return row
        if not (row.get("ok") and path.is_dir()):  # else only scored again, below
            row = None
    if row is None:
        print(f"[{time.strftime('%H:%M:%S')}] {label} {setting} on {model.name} ...", flush=True)
        row = {"label": label, "tool": tool, "method": method, "symmetric": symmetric}
        row |= {"setting": setting, "bits": bits, "group_size": group, "model": model.name}
        row |= _measured(cmd, result, ctx["work"] / f"{tag}.log")
    else:
        print(f"[scored again] {label} {setting} on {model.name} ...", flush=True)
    if row.get("ok") and ctx["windows"] is not None:
        row |= _perplexity(kind, path, ctx["windows"], ctx["reference"])
    if row.get("ok"):
        row.pop("trace", None)
    elif "trace" in row:
        row["trace"] = row["trace"][-1500:]
    print(f"    -> {_brief(row)}", flush=True)
    saved.write_text(json.dumps(row, indent=2) + "\n")
    return row


def _brief(row: dict[str, Any]) -> str:
    if not row.get("ok"):
        return f"FAILED: {row.get('error')}"
    ppl = f"ppl {row['perplexity']:.4f}, " if "perplexity" in row else ""
    ppl += f"ood {row['perplexity_ood']:.3f}, " if "perplexity_ood" in row else ""
    ppl += f"kl {row['kl']:.5f} / {row['kl_ood']:.5f}, " if "kl_ood" in row else ""
    return f"{ppl}{row['quantize_seconds']:.1f} s, peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB"


def _random_model(work: Path, layers: int, base: Path) -> Path:
    """`base`'s config and tokenizer (pydoc-16m's) with `layers` random layers (transformers'
    init)."""

    import torch
    import transformers

    path = work / f"random-{layers}L"
    if (path / "config.json").exists():
        return path
    config = json.loads((base / "config.json").read_text())
    config["num_hidden_layers"] = layers
    torch.manual_seed(layers)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, path / name)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    for flag in ("--model", "--tokens", "--method", "--out", "--result"):
        w.add_argument(flag, required=flag != "--tokens")
    w.add_argument("--bits", type=int, required=True)
    w.add_argument("--group-size", type=int, required=True)
    w.add_argument("--asymmetric", action="store_true")
    w.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--model",
        dest="model_dir",  # not "model": the worker's own --model would shadow it
        type=Path,
        default=models_dir() / "pydoc-16m",
        metavar="DIR",
        help="the checkpoint quantized (default: %(default)s)",
    )
    parser.add_argument(
        "--calib-text",
        type=Path,
        default=data_dir() / "pydoc-calib.txt",
        metavar="FILE",
        help="calibration text (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        metavar="FILE",
        help="perplexity text, held out of training (default: %(default)s)",
    )
    parser.add_argument(
        "--ood-text",
        type=lambda v: [Path(f) for f in v.split(",")],
        default=list(OOD_FILES),
        metavar="FILE[,FILE...]",
        help="out-of-domain perplexity text, files joined by blank lines (default: "
        "licences from /usr/share/common-licenses)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="torch threads of every process (default: the usable cores, %(default)s)",
    )
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ingot-bench-quantize",
        metavar="DIR",
        help="intermediate checkpoints and finished rows (default: %(default)s)",
    )
    parser.add_argument(
        "--llmc-python",
        type=Path,
        default=peer_python(LLMC),
        metavar="PATH",
        help=f"interpreter with {LLMC} installed (default: %(default)s)",
    )
    parser.add_argument("--out-dir", type=Path, default=HERE / "results", metavar="DIR")
    parser.add_argument("--skip-llmc", action="store_true")
    parser.add_argument("--skip-depth", action="store_true")
    parser.add_argument(
        "--seeds", default="1,2", help="extra calibration seeds for the GPTQ rows ('' for none)"
    )
    parser.add_argument("--depth-control", action="store_true", help="also a random 8-layer model")
    parser.add_argument("--depth-repeats", type=int, default=3)
    parser.add_argument("--reuse", action="store_true", help="reuse finished rows found in --work")
    parser.add_argument(
        "--redo", default="", help="with --reuse: rows to run again, e.g. ingot-gptq,ingot-awq"
    )
    args = parser.parse_args()
    if args.command == "worker":
        return worker(args)
    run(args)


def run(args: argparse.Namespace) -> None:
    import torch
    from machine import machine_info

    torch.set_num_threads(args.threads)  # the perplexity scoring in this process
    model = args.model_dir
    load_at_start = list(os.getloadavg())
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    from ingot.pipeline.model.load import load_model

    windows, eval_digest = _eval_windows(model, args.eval_text, args.max_windows)
    ood_windows, ood = _ood_windows(model, args.ood_text, args.max_windows)
    ctx = {
        "work": work,
        "tokens": _calibration_tokens(work, args.samples, model, args.calib_text),
        "windows": {"in": windows, "ood": ood_windows},
        "threads": args.threads,
        "llmc_python": args.llmc_python,
        "reuse": args.reuse,
        "redo": set(filter(None, args.redo.split(","))),
        "reference": load_model(model).eval(),  # the fp32 model every row's KL is from
    }
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    baseline = _perplexity("dense", model, ctx["windows"])
    rows.append({"label": "fp32 baseline", "tool": "-", "setting": "-", **baseline})
    settings = args.settings.split(",")
    for setting in settings:
        for label, tool, method, symmetric in METHODS:
            if tool == "llmc" and args.skip_llmc:
                continue
            rows.append(_run(label, tool, method, symmetric, setting, model, ctx))
    if not args.skip_llmc:  # recorded for the report: it needs an accelerator
        rows.append(
            _run("llm-compressor AWQ (asym)", "llmc", "awq", False, settings[0], model, ctx)
        )

    spread = [] if args.skip_llmc else _seed_spread(args, settings, rows, ctx)

    depth = []
    if not args.skip_depth:
        memory_ctx = {**ctx, "windows": None}  # memory only; random models have no quality
        models = [model, _random_model(work, 16, model)]
        if args.depth_control:  # a random model as deep as pydoc-16m: weights do not matter
            models.insert(1, _random_model(work, 8, model))
        for depth_model in models:
            for repeat in range(args.depth_repeats):
                ctx_r = {**memory_ctx, "repeat": repeat}
                row = _run("ingot GPTQ (sym)", "ingot", "gptq", True, "w4g128", depth_model, ctx_r)
                depth.append({**row, "repeat": repeat})

    report = {
        "benchmark": "quantize",
        "machine": machine_info(),
        # Other work on the host slows every row alike only roughly; the load says how busy.
        "load_average": {"start": load_at_start, "end": list(os.getloadavg())},
        "model": portable(str(model)),
        "threads": args.threads,
        "calibration": {
            "dataset": args.calib_text.name,
            "samples": args.samples,
            "seq_len": 512,
            "seed": 0,
        },
        "evaluation": _evaluation(args.eval_text, eval_digest, windows),
        "evaluation_ood": ood,
        "rows": rows,
        "seed_spread": spread,
        "depth": depth,
        "targets": _targets(rows, depth, settings, spread),
        "notes": _notes(rows),
        "seconds": time.perf_counter() - started,
    }
    _write_reports(report, args.out_dir, args.llmc_python)


def _write_reports(report: dict[str, Any], out_dir: Path, llmc_python: Path) -> None:
    """quantize.json and quantize.md, naming no path of this machine: llm-compressor's
    tracebacks point into its virtualenv, wherever that is."""
    venv = llmc_python.parent.parent
    roots = {venv: f"<{LLMC}-venv>"} if (venv / "pyvenv.cfg").is_file() else {}
    report = portable_report(report, roots)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "quantize.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "quantize.md").write_text(_markdown(report))
    print((out_dir / "quantize.md").read_text())


def _seed_spread(args, settings, rows, ctx) -> list[dict[str, Any]]:
    """The GPTQ rows again on windows drawn with other calibration seeds: how far perplexity
    moves with the calibration sample alone, the yardstick for the differences above."""
    seeds = [int(x) for x in args.seeds.split(",") if x]
    spread = []
    gptq = [m for m in METHODS if m[2].startswith("gptq")]
    for setting in settings:
        for label, tool, method, symmetric in gptq:
            by_seed = {"0": _find(rows, label, setting) or {}}
            for seed in seeds:
                tokens = _calibration_tokens(
                    ctx["work"], args.samples, args.model_dir, args.calib_text, seed
                )
                seed_ctx = {**ctx, "tokens": tokens, "seed": seed}
                row = _run(label, tool, method, symmetric, setting, args.model_dir, seed_ctx)
                by_seed[str(seed)] = row
            spread.append(
                {"label": label, "setting": setting}
                | {
                    f"{key}_by_seed": {seed: row.get(key) for seed, row in by_seed.items()}
                    for key in (*SEED_SCORES, "quantize_seconds")
                }
            )
    return spread


SEED_SCORES = {  # a row's key -> its line in the seed table
    "perplexity": "pydoc ppl",
    "perplexity_ood": "ood ppl",
    "kl": "pydoc KL",
    "kl_ood": "ood KL",
}


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    notes = [
        "quantize s: the quantization call only. ingot GPTQ / AWQ: `quantize_layers`, the "
        "build's layer-sequential path (reads each layer from disk, writes the IR); ingot RTN: "
        "`quantize_model` in memory; llm-compressor: `oneshot` on the loaded model (not "
        "loading, not saving).",
        "peak RSS: the whole quantizing process (imports, model, calibration activations), "
        "from getrusage(RUSAGE_CHILDREN) of a wrapper that runs only that process.",
        "GPTQ on both sides: symmetric, act order with static groups, block 128, dampening "
        "0.01 (llm-compressor's defaults). ingot GPTQ is the recipe's default, true-sequential "
        "inside each layer (q,k,v -> o -> gate,up -> down, as AutoGPTQ); 'one pass' observes "
        "every group of a layer as loaded, as llm-compressor does. AWQ is compared with RTN "
        "at the same (asymmetric) scheme.",
    ]
    codes = sorted({r["code"] for r in rows if r.get("code")})
    if codes:
        notes.append(f"ingot quantization code measured (sha256 prefix): {', '.join(codes)}.")
    for r in rows:
        if r["tool"] == "llmc" and r.get("method") == "awq" and not r.get("ok"):
            notes.append(
                f"llm-compressor AWQ does not run on this CPU-only host: `{r.get('error')}` "
                "(AWQModifier pins its cached activations to accelerator memory)."
            )
    return notes


def _find(rows, label: str, setting: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["label"] == label and r["setting"] == setting), None)


def _targets(rows, depth, settings, spread=()) -> list[dict[str, Any]]:
    """Each target with its verdict: true, false, or null when a row it needs failed."""

    def ppl(label, setting, key="perplexity"):
        row = _find(rows, label, setting)
        return row.get(key) if row else None

    def secs(label, setting):
        row = _find(rows, label, setting)
        return row.get("quantize_seconds") if row and row.get("ok") else None

    def verdict(a, b, ok):
        return None if a is None or b is None else bool(ok(a, b))

    targets = []
    for s in settings:
        gptq, llmc = ppl("ingot GPTQ (sym)", s), ppl("llm-compressor GPTQ (sym)", s)
        targets.append(
            {
                "target": f"ingot GPTQ ppl <= llm-compressor GPTQ ppl ({s})",
                "values": [gptq, llmc],
                "met": verdict(gptq, llmc, lambda a, b: a <= b),
            }
        )
        gptq, llmc = (
            ppl(label, s, "perplexity_ood")
            for label in ("ingot GPTQ (sym)", "llm-compressor GPTQ (sym)")
        )
        targets.append(
            {
                "target": f"ingot GPTQ ppl <= llm-compressor GPTQ ppl ({s}, out-of-domain)",
                "values": [gptq, llmc],
                "met": verdict(gptq, llmc, lambda a, b: a <= b),
            }
        )
        awq, rtn = ppl("ingot AWQ (asym)", s), ppl("ingot RTN (asym)", s)
        targets.append(
            {
                "target": f"ingot AWQ ppl <= ingot RTN ppl, both asymmetric ({s})",
                "values": [awq, rtn],
                "met": verdict(awq, rtn, lambda a, b: a <= b),
            }
        )
        ti, tl = secs("ingot GPTQ (sym)", s), secs("llm-compressor GPTQ (sym)", s)
        targets.append(
            {
                "target": f"ingot GPTQ calibration time <= 0.7x llm-compressor GPTQ ({s})",
                "values": [ti, tl],
                "met": verdict(ti, tl, lambda a, b: a <= 0.7 * b),
            }
        )
    targets += _seed_targets(spread)
    by_model = {m: statistics.median(peaks) for m, peaks in _peaks_by_model(depth).items()}
    for base in [b for b in ("pydoc-16m", "random-8L") if b in by_model]:
        shallow, deep = by_model.get(base), by_model.get("random-16L")
        targets.append(
            {
                "target": f"ingot GPTQ median peak RSS (MiB) grows < 10% from {base} to random-16L",
                "values": [shallow, deep],
                "met": verdict(shallow, deep, lambda a, b: b < 1.10 * a),
            }
        )
    return targets


def _seed_targets(spread) -> list[dict[str, Any]]:
    """The GPTQ targets again over every calibration seed: mean perplexity, median time."""
    targets = []
    by = {(r["label"], r["setting"]): r for r in spread}
    for setting in dict.fromkeys(r["setting"] for r in spread):
        ingot, llmc = (
            by.get(("ingot GPTQ (sym)", setting)),
            by.get(("llm-compressor GPTQ (sym)", setting)),
        )
        if not (ingot and llmc):
            continue
        secs = [_median(r.get("quantize_seconds_by_seed", {}).values()) for r in (ingot, llmc)]
        n = len(ingot["perplexity_by_seed"])
        for key, what in SEED_SCORES.items():
            ppl = [_mean(r.get(f"{key}_by_seed", {}).values()) for r in (ingot, llmc)]
            targets.append(
                {
                    "target": f"ingot GPTQ mean {what} over {n} seeds <= llm-compressor GPTQ's "
                    f"({setting})",
                    "values": ppl,
                    "met": None if None in ppl else ppl[0] <= ppl[1],
                }
            )
        targets.append(
            {
                "target": f"ingot GPTQ median time over {n} seeds <= 0.7x llm-compressor GPTQ's "
                f"({setting})",
                "values": secs,
                "met": None if None in secs else secs[0] <= 0.7 * secs[1],
            }
        )
    return targets


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _peaks_by_model(depth) -> dict[str, list[float]]:
    peaks: dict[str, list[float]] = {}
    for r in depth:
        if r.get("ok"):
            peaks.setdefault(r["model"], []).append(r["peak_rss_bytes"] / 2**20)
    return peaks


def _markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    ev, cal, ood = report["evaluation"], report["calibration"], report["evaluation_ood"]
    base = next(r for r in report["rows"] if r["tool"] == "-")
    files = ", ".join(f"`{Path(f['path']).name}` ({f['sha256'][:12]})" for f in ood["files"])
    lines = [
        "# Quantization benchmark",
        "",
        f"{m['cpu_model']}, {m['usable_cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB, "
        f"{m['date']}; torch {m['versions'].get('torch')}; 1-min load average "
        f"{report['load_average']['start'][0]:.1f} at the start, "
        f"{report['load_average']['end'][0]:.1f} at the end (other work on the host).",
        f"Model `{report['model']}`; calibration {cal['samples']} x {cal['seq_len']} tokens of "
        f"`{cal['dataset']}` (the same windows for both tools); perplexity on {ev['windows']} "
        f"windows of {ev['seq_len']} tokens of `{ev['dataset']}` (held-out Python "
        f"documentation: in-distribution) and on {ood['windows']} windows of {ood['seq_len']} "
        f"tokens of out-of-domain {ood['dataset']}: {files} from "
        f"`{Path(ood['files'][0]['path']).parent}` (sha256 prefixes), joined by blank lines "
        "(fp32, ingot's harness). Δ: perplexity minus fp32's on the same text; KL: mean "
        "KL(fp32 || quantized) per predicted token, in 1e-3 nats (how far the predictions moved "
        "from the float model's, either way: out of domain, quantization noise can lower the "
        "perplexity of an overconfident float model).",
        "W3 runs through the quantizers' Python API (recipes allow bits 4 | 8).",
        "",
        "| method | setting | pydoc-eval ppl | Δ | KL | out-of-domain ppl | Δ | KL "
        "| quantize s | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(_md_row(r, base))
    if report["depth"]:
        lines += ["", "Peak RSS of ingot GPTQ W4 g128 by depth (same width 384):", ""]
        lines += ["| model | layers | quantize s (each run) | peak RSS MiB (each run) | median |"]
        lines += ["|---|---:|---:|---:|---:|"]
        peaks = _peaks_by_model(report["depth"])
        for model in dict.fromkeys(r["model"] for r in report["depth"]):
            runs = [r for r in report["depth"] if r["model"] == model]
            layers = {"pydoc-16m": 8}.get(model) or int(model.split("-")[1][:-1])
            secs = ", ".join(
                f"{r['quantize_seconds']:.0f}" if r.get("ok") else "FAILED" for r in runs
            )
            rss = ", ".join(f"{p:.0f}" for p in peaks.get(model, []))
            median = f"{statistics.median(peaks[model]):.0f}" if model in peaks else "-"
            lines.append(f"| {model} | {layers} | {secs} | {rss} | {median} |")
    if report.get("seed_spread"):
        seeds = sorted({k for r in report["seed_spread"] for k in r["perplexity_by_seed"]}, key=int)
        title = (
            "GPTQ by calibration seed: perplexity on pydoc-eval (quantize s) and out of domain, "
            "KL (1e-3 nats) on each; seed 0 is the table above, each other seed draws other "
            "windows of the calibration text:"
        )
        lines += ["", title, ""]
        lines += [
            "| method | setting | text | " + " | ".join(f"seed {k}" for k in seeds) + " | mean |"
        ]
        lines += ["|---|---|---|" + "---:|" * (len(seeds) + 1)]
        for r in report["seed_spread"]:
            secs = [r.get("quantize_seconds_by_seed", {}).get(k) for k in seeds]
            for key, text in SEED_SCORES.items():
                scale = 1e3 if key.startswith("kl") else 1  # KL in 1e-3 nats
                values = [r.get(f"{key}_by_seed", {}).get(k) for k in seeds]
                values = [None if v is None else v * scale for v in values]
                mean = "-" if _mean(values) is None else f"{_mean(values):.4f}"
                times = secs if key == "perplexity" else [None] * len(seeds)
                cells = " | ".join(
                    _ppl_and_seconds(v, t) for v, t in zip(values, times, strict=True)
                )
                lines.append(f"| {r['label']} | {r['setting']} | {text} | {cells} | {mean} |")
    lines += ["", *(f"- {n}" for n in report.get("notes", []))]
    lines += ["", "| target | values | met |", "|---|---|---|"]
    for t in report["targets"]:
        values = ", ".join("-" if v is None else f"{v:.4g}" for v in t["values"])
        met = {True: "yes", False: "**no**", None: "n/a (a run failed)"}[t["met"]]
        lines.append(f"| {t['target']} | {values} | {met} |")
    return "\n".join(lines) + "\n"


def _ppl_and_seconds(ppl: float | None, seconds: float | None) -> str:
    if ppl is None:
        return "-"
    return f"{ppl:.4f}" + ("" if seconds is None else f" ({seconds:.0f})")


def _md_row(r: dict[str, Any], base: dict[str, Any]) -> str:
    cells = []
    for domain, key in DOMAINS.items():
        value, kl = r.get(key), r.get(KL[domain])
        cells.append("-" if value is None else f"{value:.4f}")
        delta = None if value is None or r is base else value - base[key]
        cells.append("-" if delta is None else f"{delta:+.4f}")
        cells.append("-" if kl is None else f"{kl * 1e3:.2f}")
    if r["tool"] == "-":
        return f"| {r['label']} | - | {' | '.join(cells)} | - | - |"
    if not r.get("ok"):
        error = str(r.get("error", "")).replace("|", "/")[:160]
        return f"| {r['label']} | {r['setting']} | FAILED: {error} | | | | | | | |"
    rss = r["peak_rss_bytes"] / 2**20
    return (
        f"| {r['label']} | {r['setting']} | {' | '.join(cells)} | "
        f"{r['quantize_seconds']:.1f} | {rss:.0f} |"
    )


if __name__ == "__main__":
    main()
