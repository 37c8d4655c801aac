"""Decode speed of this checkout against an earlier revision, the two alternating on one host.

Reproduce (about 5 minutes on 2 cores; needs the editable install the README's commands make;
writes benchmarks/results/ab_revisions.json and ab_revisions.md, refused on a loaded host):

    .venv/bin/python -m benchmarks.decode.ab_revisions --base 8a51242 [--rounds 5]
        [--out-dir DIR] [--report-only]

This host's speed drifts by tens of percent over minutes, so two code versions measured one after
the other do not compare; here they alternate case by case. The base revision is checked out into
a temporary git worktree, and its processes import ingot from there: the editable install's path
mapping is pointed at the worktree before anything of ingot is imported (`_BOOT`). Each side
builds its own artifact of the same recipe (pydoc-16m, RTN int4 g32 symmetric on every linear,
lm_head included, ONNX Runtime CPU at level extended with MatMulNBits accuracy level 4, KV fp32
in blocks of 16), then each case runs in a fresh process of its side, the sides alternating for
`--rounds` rounds (harness.rounds.interleave in a fixed order: the committed report's
protocol); a process reports its best of 3 timed runs after a warm-up one, and the report
takes the median over rounds. Cases (greedy, EOS ignored, prefix caching off; tok/s
counts the decode steps after each request's prefill step):

- batch 1: one 32-token prompt, 256 tokens;
- 32 x 250: 32 prompts of 250 tokens decoding together, 64 tokens each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.decode.artifact import decode_recipe
from benchmarks.decode.models import prepare_model
from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS, data_dir, models_dir
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave

STEM = "ab_revisions"
CASES = {"batch 1": (1, 32, 256), "32 x 250": (32, 250, 64)}  # sequences, prompt, new tokens

# Run first in every process: with INGOT_CHECKOUT set, the editable install's finder maps
# ingot's packages into that checkout instead of this one.
_BOOT = """
import os, sys
old = os.environ.get("INGOT_CHECKOUT")
if old:
    finders = [m for m in sys.modules if m.startswith("__editable___ingot_")]
    if not finders:
        raise SystemExit("ab_revisions needs ingot installed in editable mode (pip install -e)")
    mapping = sys.modules[finders[0]].MAPPING
    for name, path in list(mapping.items()):
        mapping[name] = path.replace(os.environ["INGOT_HERE"], old, 1)
"""

_BUILD = """
import json, sys
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
result = build(sys.argv[1], sys.argv[2], cache=StageCache(sys.argv[3]))
import ingot.runtime
print(json.dumps([str(result.artifact), ingot.runtime.__file__]))
"""

_DECODE = """
import json, sys, time
from ingot.runtime import LoadedModel, SamplingParams
artifact, seqs, prompt_len, new = sys.argv[1], *map(int, sys.argv[2:5])
model = LoadedModel.load(artifact, kv_cache_bytes=None, max_num_seqs=seqs,
                         max_num_batched_tokens=max(2048, seqs * prompt_len),
                         enable_prefix_caching=False)
generator = model.generator()
prompts = [[100 + (i * 7 + j) % 500 for j in range(prompt_len)] for i in range(seqs)]
def once():
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    ids = [generator.add(p, params) for p in prompts]
    generator.step()  # every prompt's prefill
    start = time.perf_counter()
    while generator.has_unfinished():
        generator.step()
    elapsed = time.perf_counter() - start
    for i in ids:
        generator.pop_completion(i)
    return seqs * (new - 1) / elapsed
once()
import ingot.runtime
print(json.dumps([max(once() for _ in range(3)), ingot.runtime.__file__]))
"""


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    base = _git("rev-parse", "--short", args.base)
    head = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    with tempfile.TemporaryDirectory(prefix="ingot-ab-") as tmp:
        tmp = Path(tmp)
        worktree = tmp / "base"
        _git("worktree", "add", "--detach", str(worktree), base)
        try:
            sides = {f"{base} (base)": worktree, f"{head} (this checkout)": None}
            recipe = _write_recipe(tmp / "recipe.yaml")
            artifacts = {
                side: _run(_BUILD, checkout, str(recipe), str(tmp / f"out{i}"), str(tmp / f"c{i}"))
                for i, (side, checkout) in enumerate(sides.items())
            }
            watch.sample()

            def run(case_side: tuple[str, str], _: int) -> float:
                case, side = case_side
                numbers = [str(n) for n in CASES[case]]
                return _run(_DECODE, sides[side], artifacts[side], *numbers)

            pairs = [(case, side) for case in CASES for side in sides]
            runs = interleave(
                pairs, args.rounds, run, after_round=lambda _: watch.sample(), rotate=False
            )
            results = {c: {s: runs[c, s] for s in sides} for c in CASES}
        finally:
            _git("worktree", "remove", "--force", str(worktree))
    rows = []
    for case, by_side in results.items():
        medians = {side: float(np.median(v)) for side, v in by_side.items()}
        old, new = medians.values()
        rows.append({"case": case, "tok_s": by_side, "median": medians, "ratio": new / old})
    report = {
        "benchmark": "ab_revisions",
        "machine": machine_info(),
        "base": base,
        "head": head,
        "head_has_uncommitted_changes": dirty,
        "rounds": args.rounds,
        "rows": rows,
        "load": watch.record(),
        "refused": watch.refusal(),
        "duration_s": round(time.perf_counter() - started, 1),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _run(script: str, checkout: Path | None, *argv: str) -> Any:
    """`script` in a fresh interpreter importing ingot from `checkout` (None: this one); the
    value its last output line holds, after checking where its ingot came from."""
    env = {"INGOT_HERE": str(REPO)}
    if checkout is not None:
        env["INGOT_CHECKOUT"] = str(checkout)
    done = subprocess.run(
        [sys.executable, "-c", _BOOT + script, *argv],
        capture_output=True,
        text=True,
        env={**_environ(), **env},
    )
    if done.returncode != 0:
        raise RuntimeError(f"a benchmark process failed:\n{done.stderr[-3000:]}")
    value, runtime_file = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(runtime_file).resolve().is_relative_to(checkout or REPO):
        raise RuntimeError(
            f"the process ran ingot from {runtime_file}, not from {checkout or REPO}"
        )
    return value


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("INGOT_CHECKOUT", "INGOT_HERE")}


def _write_recipe(path: Path) -> Path:
    """decode.py's recipe of pydoc-16m on 2 threads (JSON is YAML)."""
    model = prepare_model("pydoc-16m", models_dir(), data_dir() / "pydoc-eval.txt")
    path.write_text(json.dumps(decode_recipe(model, 2, []), indent=2))
    return path


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    head = report["head"] + (
        " with uncommitted changes" if report["head_has_uncommitted_changes"] else ""
    )
    lines = [
        f"# Decode: {head} against {report['base']}, alternating",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores. "
        f"`.venv/bin/python -m benchmarks.decode.ab_revisions --base {report['base']} --rounds "
        f"{report['rounds']}` ({report['duration_s']} s). pydoc-16m, RTN int4 g32, MatMulNBits "
        "accuracy level 4, KV fp32; each number a process's best of 3 runs, the two revisions "
        "alternating case by case; medians over the rounds.",
        "",
        "| case | " + " | ".join(report["rows"][0]["median"]) + " | ratio |",
        "|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        cells = [
            f"{med:.0f} ({', '.join(f'{x:.0f}' for x in row['tok_s'][side])})"
            for side, med in row["median"].items()
        ]
        lines.append(f"| {row['case']} | " + " | ".join(cells) + f" | {row['ratio']:.2f}x |")
    lines += [
        "",
        "decode tok/s: median (every round).",
        "",
        load_line(report["load"], report["refused"]),
        "",
    ]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the earlier revision (git rev; required to measure)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.base is None and not args.report_only:
        parser.error("the following arguments are required: --base")
    return args


if __name__ == "__main__":
    sys.exit(main())
