"""Pull benchmark: `ingot pull` of a large blob from a loopback registry into an empty store,
against a plain HTTP GET of the same blob; and what verify-once saves at load (a full sha256
verify of the pulled artifact against the stat check of the store's record).

    .venv/bin/python -m benchmarks.serve.pull [--work DIR] [--blob-gib 1] [--repeats 3]
        [--registry-bin PATH] [--out-dir DIR] [--report-only]

The artifact is a tiny random-weight Llama build with one more file of `--blob-gib` GiB of
random bytes under engines/onnxruntime-cpu/ (role engine:onnxruntime-cpu), so a pull for that
target fetches it. The registry is Debian's docker-registry on 127.0.0.1 (plain HTTP, filesystem
storage on the same disk, the blob in the page cache). The baselines are `curl` GETs of the
blob's URL, into /dev/null and into a file followed by `sync FILE` (pull fsyncs each blob
before renaming it into the store). The pull runs in this process (no interpreter start-up) and
includes the OCI manifest, manifest.json, the blobs (hashed as they stream), the hard links,
the check of the laid-out directory and the stat record. The host's load is sampled around
the runs (LoadWatch); a run above it is written REFUSED and exits 1. Writes
benchmarks/results/pull.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.decode.models import build_random_llama
from benchmarks.harness.load import LoadWatch, load_line, wait_idle
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.scale.registry import REGISTRY_BIN, LocalRegistry

STEM = "pull"
BLOB = "engines/onnxruntime-cpu/blob.bin"  # the large file; its role: engine:onnxruntime-cpu
TARGET = "onnxruntime-cpu"
CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=510,
    eos_token_id=511,
)


def build_artifact(work: Path, blob_bytes: int) -> Path:
    """A tiny build plus BLOB of `blob_bytes` random bytes, listed in a rewritten manifest."""
    from ingot.artifacts import read_manifest, write_manifest
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    out = work / "artifact"
    if (out / BLOB).is_file() and (out / BLOB).stat().st_size == blob_bytes:
        return out
    shutil.rmtree(out, ignore_errors=True)
    build_random_llama(work / "ckpt", CONFIG, "float32")
    recipe = work / "recipe.yaml"
    recipe.write_text(  # JSON is YAML
        '{"source": {"path": "%s"}, "quantize": [], "export": {"max_seq_len": 128},'
        ' "kv_cache": {"dtype": "fp32", "block_size": 16},'
        ' "artifact": {"name": "bench-pull", "version": "1"}}' % (work / "ckpt")
    )
    build(recipe, out, cache=StageCache(work / "cache"))
    shutil.rmtree(work / "cache")
    with open(out / BLOB, "wb") as f:
        for _ in range(blob_bytes >> 24):
            f.write(os.urandom(16 << 20))
    fields = read_manifest(out).model_dump(mode="json")
    del fields["files"]
    write_manifest(out, fields)
    return out


def time_get(url: str, into: Path | None) -> float:
    """One `curl` GET of `url`: into /dev/null, or into `into` and synced to disk."""
    target = str(into) if into is not None else "/dev/null"
    started = time.perf_counter()
    subprocess.run(["curl", "-sf", "-o", target, url], check=True)
    if into is not None:
        subprocess.run(["sync", str(into)], check=True)
    elapsed = time.perf_counter() - started
    if into is not None:
        into.unlink()
    return elapsed


def time_pull(reference: str, store_dir: Path) -> tuple[float, int, int]:
    """(seconds, downloaded bytes, files absent) of a pull for TARGET into an empty store."""
    from ingot.artifacts.oci import pull
    from ingot.artifacts.roles import engine_roles, target_engine
    from ingot.artifacts.store import BlobStore

    shutil.rmtree(store_dir, ignore_errors=True)
    started = time.perf_counter()
    result = pull(
        reference,
        store=BlobStore(store_dir),
        roles=lambda m: engine_roles(m, target_engine(m, TARGET)),
    )
    return time.perf_counter() - started, result.downloaded_bytes, len(result.absent)


def time_checks(artifact_dir: Path, repeats: int) -> dict[str, list[float]]:
    """Seconds of the full verify (every byte hashed) and of the store's stat check."""
    from ingot.artifacts.store import verify_stored

    runs: dict[str, list[float]] = {"full": [], "stat": []}
    for _ in range(repeats):
        for kind in runs:
            started = time.perf_counter()
            verified = verify_stored(artifact_dir, full=kind == "full")
            runs[kind].append(time.perf_counter() - started)
            assert (len(verified.hashed) > 0) == (kind == "full"), verified.hashed
    return runs


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    blob_bytes = int(args.blob_gib * (1 << 30))
    artifact = build_artifact(work, blob_bytes)
    artifact_bytes = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    # The 1-minute load lags the work before this run (the build above, the lock's last holder).
    wait_idle(300, lambda line: print(line, file=sys.stderr), poll_s=10)
    watch = LoadWatch(len(os.sched_getaffinity(0)))
    registry = LocalRegistry(work / "registry", args.registry_bin)
    try:
        measured = _measure(artifact, work, registry, args.repeats, watch)
    finally:
        registry.stop()
        shutil.rmtree(work / "registry", ignore_errors=True)
    report = {
        "benchmark": STEM,
        "blob_bytes": blob_bytes,
        "artifact_bytes": artifact_bytes,
        "target": TARGET,
        **measured,
        "machine": machine_info(),
        "load": watch.record(),
        "refused": watch.refusal(),
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _measure(
    artifact: Path, work: Path, registry: LocalRegistry, repeats: int, watch: LoadWatch
) -> dict[str, Any]:
    from ingot.artifacts.oci import push
    from ingot.artifacts.store import BlobStore

    pushed = push(artifact, registry.ref("bench/pull:v1"))
    digest = "sha256:" + _sha256_of_listed(artifact, BLOB)
    url = f"http://127.0.0.1:{registry.port}/v2/bench/pull/blobs/{digest}"
    reference = f"oci://{pushed.reference}"
    get_null, get_file, pulls = [], [], []
    downloaded = absent = 0
    for _ in range(repeats):
        get_null.append(time_get(url, None))
        get_file.append(time_get(url, work / "get.bin"))
        seconds, downloaded, absent = time_pull(reference, work / "store")
        pulls.append(seconds)
        watch.sample()
    stored = BlobStore(work / "store").artifact_dir(pushed.digest)
    checks = time_checks(stored, repeats)
    watch.sample()
    shutil.rmtree(work / "store", ignore_errors=True)
    return {
        "get_devnull_seconds": get_null,
        "get_file_sync_seconds": get_file,
        "pull_seconds": pulls,
        "pull_downloaded_bytes": downloaded,
        "pull_absent_files": absent,
        "verify_full_seconds": checks["full"],
        "verify_stat_seconds": checks["stat"],
    }


def _sha256_of_listed(artifact: Path, path: str) -> str:
    from ingot.artifacts import read_manifest

    return next(f.sha256 for f in read_manifest(artifact).files if f.path == path)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "ingot-bench-pull"
    )
    parser.add_argument("--blob-gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--registry-bin", default=REGISTRY_BIN, metavar="PATH")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    add_report_only(parser)
    return parser.parse_args(argv)


def _mb_s(size: int, seconds: list[float]) -> float:
    return size / 1e6 / min(seconds)


def _markdown(r: dict[str, Any]) -> str:
    m, blob = r["machine"], r["blob_bytes"]
    pulled = r["pull_downloaded_bytes"]
    rows = [
        ("`curl` GET of the blob into /dev/null", r["get_devnull_seconds"], blob),
        ("`curl` GET of the blob into a file + `sync FILE`", r["get_file_sync_seconds"], blob),
        (f"`pull(--target {r['target']})` into an empty store", r["pull_seconds"], pulled),
    ]
    raw = _mb_s(blob, r["get_file_sync_seconds"])
    raw_null = _mb_s(blob, r["get_devnull_seconds"])
    pull = _mb_s(pulled, r["pull_seconds"])
    full, quick = min(r["verify_full_seconds"]), min(r["verify_stat_seconds"])
    lines = [
        "# Pull benchmark",
        "",
        f"One blob of {blob / 2**30:.2f} GiB of random bytes in an artifact of "
        f"{r['artifact_bytes'] / 2**30:.2f} GiB, from docker-registry on 127.0.0.1 (plain "
        "HTTP, the blob in the page cache). The pull fetched the target's files only "
        f"({pulled / 1e6:.0f} MB; {r['pull_absent_files']} files absent).",
        "",
        "| operation | best s | MB/s | all runs (s) |",
        "|---|---:|---:|---|",
    ]
    for name, seconds, size in rows:
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        lines.append(f"| {name} | {min(seconds):.2f} | {_mb_s(size, seconds):.0f} | {runs} |")
    lines += [
        "",
        f"Pull throughput: **{pull / raw:.0%}** of the plain GET into a synced file, "
        f"{pull / raw_null:.0%} of the GET into /dev/null (the issue's target: >= 80%). A pull "
        "lands the bytes durably (fsync before the rename into the store) and hashes each one: "
        f"sha256 of the pulled files alone (the full check below) runs at "
        f"{pulled / 1e6 / full:.0f} MB/s here, so no verifying pull can reach 80% of the GET "
        "into /dev/null on this host.",
        "",
        "Load-time check of the pulled artifact in the store (every file):",
        "",
        "| check | best s | all runs (s) |",
        "|---|---:|---|",
        f"| full (`ingot verify --full`: sha256 of every byte) | {full:.3f} | "
        + ", ".join(f"{s:.3f}" for s in r["verify_full_seconds"])
        + " |",
        f"| verify once (stat of each file against the store's record) | {quick:.4f} | "
        + ", ".join(f"{s:.4f}" for s in r["verify_stat_seconds"])
        + " |",
        "",
        f"Verify-once saves {full - quick:.2f} s per load of this artifact "
        f"({full / max(quick, 1e-9):.0f}x less time in the check).",
        "",
        f"Machine: {m['cpu_model']}, {m['usable_cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB "
        f"RAM, {m['platform']}, Python {m['python']}, {m['date']}. "
        + load_line(r["load"], r["refused"]),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
