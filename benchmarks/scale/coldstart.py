"""Cold start and resident memory of a real-size artifact (issue 28): ingot's load of the
artifact directory and its first token, against llama.cpp on the same weights as a GGUF
(ingot's `interop: [gguf]` export of an RTN int4 g32 symmetric build: Q4_0) and
onnxruntime-genai's model folder where its builder finished; then batch-1 decode and the peak
resident memory of each process (benchmarks/scale/coldstart_worker.py).

Each case runs in a fresh process, first with the page cache dropped (`/proc/sys/vm/
drop_caches`: the weights come from the disk, as on a pod's first start; where it cannot be
written the report says "warm" and every run is warm), then again with the files cached. ingot
runs as the runtime opens an engine (its weights file read ahead, the external data
memory-mapped by ONNX Runtime, MatMulNBits weights prepacked at load: a heap copy in the
kernel's layout, the mapped original released); with `--parallel-prepack` also with
`session.prepack.enable_parallel`, with `--no-prepack` with `session.disable_prepacking` (the
weights stay mapped from the engine file). The manifest is read but not re-hashed (helper
store's verify-once; the (a) pull column is store's registry benchmark).

    .venv/bin/python -m benchmarks.scale.coldstart --artifact DIR [--gguf FILE]
        [--ortgenai-dir DIR] [--parallel-prepack] [--no-prepack] [--label TEXT] [--note TEXT]
        [--threads N]
        [--out-dir benchmarks/results] [--report-only]

Reports: benchmarks/results/coldstart.json and coldstart.md. Run it alone, on a quiet host:
a run whose host load exceeded the thread count is refused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, peer_python
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "coldstart"
WORKER = "benchmarks.scale.coldstart_worker"
TIMEOUT_S = 1800
GIB = 2**30
PROMPT_LEN, TOKENS = 32, 32
KV_CACHE_BYTES = 256 << 20  # 512 tokens of the 8B shape's fp16 KV, 1 sequence
PREPACK_OFF = {"session.disable_prepacking": "1"}
PARALLEL_PREPACK = {"session.prepack.enable_parallel": "1"}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    prompt = [(7919 * i) % 120000 + 100 for i in range(PROMPT_LEN)]  # arbitrary ids < BOS
    cases = _cases(args, prompt)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ingot-coldstart-") as tmp:
        for name, spec, python in cases:
            for cache in ("cold", "warm"):
                dropped = cache == "cold" and _drop_page_cache()
                row: dict[str, Any] = {
                    "case": name,
                    "cache": cache
                    if dropped or cache == "warm"
                    else "warm (page cache not droppable)",
                }
                try:
                    row |= run_worker(WORKER, spec, Path(tmp), TIMEOUT_S, python)
                except WorkerFailed as e:
                    row["error"] = str(e)
                rows.append(row)
                watch.sample()
    report = {
        "label": args.label,
        "note": args.note,
        "weights_bytes": _weights_bytes(args),
        "prompt_tokens": PROMPT_LEN,
        "decode_tokens": TOKENS,
        "threads": args.threads,
        "rows": rows,
        "machine": machine_info(),
        "load": watch.record(),
        "refused": watch.refusal(),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, help="an ingot artifact directory")
    parser.add_argument("--gguf", type=Path, help="the same weights as a GGUF file")
    parser.add_argument("--ortgenai-dir", type=Path, help="onnxruntime-genai's model folder")
    parser.add_argument("--label", default="llama-3.1-8b shape, RTN int4 g32")
    parser.add_argument(
        "--parallel-prepack",
        action="store_true",
        help="also ingot with session.prepack.enable_parallel (prepacking on the intra-op threads)",
    )
    parser.add_argument("--note", default="", help="how the files were made (the report says)")
    parser.add_argument(
        "--no-prepack",
        action="store_true",
        help="also ingot with session.disable_prepacking (slow: the 1B shape decodes at "
        "~0.2 tok/s without the packed kernels)",
    )
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


def _cases(args: argparse.Namespace, prompt: list[int]) -> list[tuple[str, dict, Any]]:
    """(case name, worker spec, interpreter) of each tool given."""
    common = {"prompt_ids": prompt, "tokens": TOKENS, "threads": args.threads}
    cases: list[tuple[str, dict, Any]] = []
    if args.artifact is not None:
        ingot = {"kind": "ingot", "artifact": str(args.artifact), "verify": False}
        ingot |= {"kv_cache_bytes": KV_CACHE_BYTES, **common}
        cases.append(("ingot (ORT, prepacked)", ingot, None))
        if args.parallel_prepack:
            parallel = {**ingot, "session_config": PARALLEL_PREPACK}
            cases.append(("ingot (ORT, parallel prepack)", parallel, None))
        if args.no_prepack:
            no_prepack = {**ingot, "session_config": PREPACK_OFF}
            cases.append(("ingot (ORT, mmap, no prepack)", no_prepack, None))
    if args.gguf is not None:
        spec = {"kind": "llama-cpp", "gguf": str(args.gguf), "n_ctx": 2048, **common}
        cases.append(("llama.cpp (Q4_0 GGUF, mmap)", spec, peer_python("llama-cpp")))
    if args.ortgenai_dir is not None:
        spec = {"kind": "ortgenai", "model_dir": str(args.ortgenai_dir), **common}
        cases.append(("onnxruntime-genai", spec, peer_python("onnxruntime-genai")))
    return cases


def _drop_page_cache() -> bool:
    """Write back and drop the page cache (root only); whether it was dropped."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _weights_bytes(args: argparse.Namespace) -> dict[str, int]:
    """Bytes of each tool's weight files (what a start reads)."""
    sizes = {}
    if args.artifact is not None:
        engines = (args.artifact / "engines").rglob("*")
        sizes["ingot engine files"] = sum(f.stat().st_size for f in engines if f.is_file())
    if args.gguf is not None:
        sizes["GGUF"] = args.gguf.stat().st_size
    if args.ortgenai_dir is not None:
        sizes["onnxruntime-genai folder"] = sum(
            f.stat().st_size for f in args.ortgenai_dir.rglob("*") if f.is_file()
        )
    return sizes


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        f"# Cold start: {r['label']}",
        "",
        *([r["note"], ""] if r.get("note") else []),
        f"Batch 1, {r['prompt_tokens']}-token prompt, greedy, {r['decode_tokens']} tokens, "
        f"{r['threads']} threads. Cold: the page cache dropped before the process starts; "
        "warm: the run right after it. (b) load = the model opened (weights mapped or read, "
        "the session made), Python imports apart; (c) first token = the prompt's prefill and "
        "the first token. (a) pull from a registry: benchmarks/results/pull.md.",
        "",
        "Weight files: "
        + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in r["weights_bytes"].items()),
        "",
        "| case | cache | import s | (b) load s | (c) first token s | (b)+(c) s | decode tok/s "
        "| peak RSS GiB | anon GiB | file GiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        if "error" in row:
            lines.append(f"| {row['case']} | {row['cache']} | failed: {row['error'][:120]} |")
            continue
        lines.append(
            f"| {row['case']} | {row['cache']} | {row['import_s']:.1f} | {row['load_s']:.1f} "
            f"| {row['first_token_s']:.1f} | {row['load_s'] + row['first_token_s']:.1f} "
            f"| {row['decode_tok_s']:.2f} | {row['peak_rss_bytes'] / GIB:.2f} "
            f"| {row['rss_anon_bytes'] / GIB:.2f} | {row['rss_file_bytes'] / GIB:.2f} |"
        )
    lines += ["", *_ratios(r), "", load_line(r["load"], r.get("refused"))]
    return "\n".join(lines) + "\n"


def _ratios(r: dict[str, Any]) -> list[str]:
    """ingot's cold (b)+(c) over llama.cpp's, and its peak RSS over its weights + KV pool."""
    ok = {(row["case"], row["cache"]): row for row in r["rows"] if "error" not in row}
    llama = ok.get(("llama.cpp (Q4_0 GGUF, mmap)", "cold"))
    weights = r["weights_bytes"].get("ingot engine files")
    lines = []
    for (case, cache), row in ok.items():
        if not case.startswith("ingot") or cache != "cold":
            continue
        start = row["load_s"] + row["first_token_s"]
        if llama is not None:
            theirs = llama["load_s"] + llama["first_token_s"]
            lines.append(
                f"- {case}: cold (b)+(c) {start:.1f} s = {start / theirs:.2f}x "
                f"llama.cpp's {theirs:.1f} s (target <= 1.5x)."
            )
        if weights:
            budget = weights + row["kv_pool_bytes"]
            lines.append(
                f"- {case}: peak RSS {row['peak_rss_bytes'] / GIB:.2f} GiB = "
                f"{row['peak_rss_bytes'] / budget:.2f}x its weight files + KV pool "
                f"({budget / GIB:.2f} GiB; target <= 1.1x)."
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
