"""One row of the quantize benchmark: a quantization by ingot or llm-compressor, each in its
own process under a wrapper that measures its peak RSS, then scored (scoring.py); finished rows
are kept in the work folder and reused with --reuse.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import module_command, module_env
from benchmarks.harness.paths import REPO
from benchmarks.quantize.scoring import DOMAINS, KL, perplexity_scores

__all__ = ["LLMC", "METHODS", "SETTINGS", "brief", "code_digest", "run_row"]

LLMC = "llmcompressor"  # the peer: benchmarks/peers/llmcompressor.txt
WORKERS = {"ingot": "benchmarks.quantize.ingot_worker", "llmc": "benchmarks.quantize.llmc"}

SETTINGS = {  # name -> (bits, group_size)
    "w4g32": (4, 32),
    "w4g128": (4, 128),
    "w4pc": (4, -1),
    "w3g128": (3, 128),
}
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


def code_digest() -> str:
    """sha256 over ingot's quantization and calibration sources: which code a row measured."""
    files = sorted([*REPO.glob("pipeline/quantize/*.py"), *REPO.glob("calibration/*.py")])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


def measured(cmd: list[str], result_file: Path, log: Path) -> dict[str, Any]:
    usage_file = result_file.with_suffix(".usage.json")
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-c", _MEASURE, str(usage_file), *cmd],
            stdout=f,
            stderr=f,
            check=False,
            env=module_env(),
        )
    usage = json.loads(usage_file.read_text())
    if result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        tail = log.read_text()[-2000:]
        result = {"ok": False, "error": f"exit code {usage['returncode']}", "trace": tail}
    return {**result, **usage}


def run_row(
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
    python = sys.executable if tool == "ingot" else ctx["llmc_python"]
    cmd = [*module_command(WORKERS[tool], python), *common]
    saved = ctx["work"] / f"{tag}.row.json"
    kind, path = ("ir", out) if tool == "ingot" else ("dense", out / "dense")
    row = None
    if ctx["reuse"] and saved.exists() and f"{tool}-{method}" not in ctx["redo"]:
        row = json.loads(saved.read_text())
        scored = {*DOMAINS.values(), *KL.values()} <= row.keys()
        if row.get("ok") and (ctx["windows"] is None or scored):
            print(f"[reused] {label} {setting} on {model.name}: {brief(row)}", flush=True)
            return row
        if not (row.get("ok") and path.is_dir()):  # else only scored again, below
            row = None
    if row is None:
        print(f"[{time.strftime('%H:%M:%S')}] {label} {setting} on {model.name} ...", flush=True)
        row = {"label": label, "tool": tool, "method": method, "symmetric": symmetric}
        row |= {"setting": setting, "bits": bits, "group_size": group, "model": model.name}
        row |= measured(cmd, result, ctx["work"] / f"{tag}.log")
    else:
        print(f"[scored again] {label} {setting} on {model.name} ...", flush=True)
    if row.get("ok") and ctx["windows"] is not None:
        row |= perplexity_scores(kind, path, ctx["windows"], ctx["reference"])
    if row.get("ok"):
        row.pop("trace", None)
    elif "trace" in row:
        row["trace"] = row["trace"][-1500:]
    print(f"    -> {brief(row)}", flush=True)
    saved.write_text(json.dumps(row, indent=2) + "\n")
    return row


def brief(row: dict[str, Any]) -> str:
    if not row.get("ok"):
        return f"FAILED: {row.get('error')}"
    ppl = f"ppl {row['perplexity']:.4f}, " if "perplexity" in row else ""
    ppl += f"ood {row['perplexity_ood']:.3f}, " if "perplexity_ood" in row else ""
    ppl += f"kl {row['kl']:.5f} / {row['kl_ood']:.5f}, " if "kl_ood" in row else ""
    return f"{ppl}{row['quantize_seconds']:.1f} s, peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB"
