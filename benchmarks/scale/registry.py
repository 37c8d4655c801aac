"""Registry benchmark: push / pull throughput of a ~1 GB artifact against a local registry
versus a plain `cp -r` of the same files, and the time to first token of
`ingot serve oci://…` on a cold and on a warm store.

    .venv/bin/python -m benchmarks.scale.registry [--work DIR] [--repeats 2]
        [--registry-bin PATH] [--out-dir DIR] [--report-only]

The artifact is a real build (random weights, fp32, no quantization) of a Llama config sized
to ~1 GB, so it verifies like any other. The registry is Debian's docker-registry on
127.0.0.1 (plain HTTP, filesystem storage on the same disk). Every copy reads from the page
cache (the files were just written), for cp as for push. The host's load is sampled around
the runs (harness.load.LoadWatch, the usable cores as threads); a run above that is written
REFUSED and exits 1. Writes reports to benchmarks/results/registry.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.decode.models import build_random_llama
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from ingot.artifacts import sha256_file

STEM = "registry"

# Debian's package puts it in /usr/bin; found on PATH first, so any install works.
REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
INGOT = [sys.executable, "-c", "from ingot.cli import main; main()"]
# ~133 M parameters in fp32: model.onnx.data and the ORT engine's copy, ~0.53 GB each.
CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=6,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    # At the top, as in Llama 3: the word-level tokenizer gives every id below BOS a word.
    bos_token_id=31998,
    eos_token_id=31999,
)


def build_artifact(work: Path) -> Path:
    """Build (once; reused on later runs) the ~1 GB artifact."""
    from ingot.artifacts import verify_artifact
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    out = work / "artifact"
    if (out / "manifest.json").exists():
        verify_artifact(out)
        return out
    build_random_llama(work / "ckpt", CONFIG, "float32")
    recipe = work / "recipe.yaml"
    recipe.write_text(  # JSON is YAML: the recipe loader reads it as is
        json.dumps(
            {
                "source": {"path": str(work / "ckpt")},
                "quantize": [],
                "kv_cache": {"dtype": "fp32", "block_size": 16},
                "export": {"max_seq_len": 512},
                "artifact": {"name": "bench-1g", "version": "1"},
            },
            indent=2,
        )
    )
    build(recipe, out, cache=StageCache(work / "cache"))
    shutil.rmtree(work / "cache")  # only the artifact is needed from here on
    return out


class LocalRegistry:
    def __init__(self, directory: Path, binary: str) -> None:
        directory.mkdir(parents=True)
        self.port = _free_port()
        config = directory / "config.yml"
        config.write_text(
            "version: 0.1\nlog: {level: error}\n"
            f"storage:\n  filesystem: {{rootdirectory: {directory / 'storage'}}}\n"
            f"http: {{addr: '127.0.0.1:{self.port}'}}\n"
        )
        self.log = open(directory / "registry.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [binary, "serve", str(config)], stdout=self.log, stderr=self.log
        )
        _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/", timeout=1))

    def ref(self, name: str) -> str:
        return f"oci://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def time_cp(artifact: Path, work: Path) -> float:
    target = work / "cp-copy"
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(artifact), str(target)], check=True)
    subprocess.run(["sync"], check=True)
    elapsed = time.perf_counter() - started
    shutil.rmtree(target)
    return elapsed


def time_push(
    artifact: Path, work: Path, run: int, registry_bin: str
) -> tuple[float, str, LocalRegistry]:
    """Push into a fresh registry (no blob exists yet): the full upload."""
    registry = LocalRegistry(work / f"registry-{run}", registry_bin)
    started = time.perf_counter()
    result = _ingot_json("push", str(artifact), registry.ref("bench/model:v1"), "--json")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - started, result["reference"], registry


def time_pull(reference: str, work: Path, run: int) -> tuple[float, int]:
    """Pull into an empty store and lay out --out (hard links: same filesystem)."""
    store, out = work / f"store-pull-{run}", work / f"pulled-{run}"
    env = {**os.environ, "INGOT_STORE_DIR": str(store)}
    started = time.perf_counter()
    result = _ingot_json("pull", f"oci://{reference}", "--out", str(out), "--json", env=env)
    subprocess.run(["sync"], check=True)
    elapsed = time.perf_counter() - started
    shutil.rmtree(store)
    shutil.rmtree(out)
    return elapsed, result["downloaded_bytes"]


def time_to_first_token(reference: str, store: Path) -> dict[str, float]:
    """Seconds from starting `ingot serve oci://…` to the first completion token."""
    port = _free_port()
    env = {**os.environ, "INGOT_STORE_DIR": str(store)}
    started = time.perf_counter()
    server = subprocess.Popen(
        [*INGOT, "serve", f"oci://{reference}", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = json.dumps({"model": "bench-1g", "prompt": "def add", "max_tokens": 1}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        _wait(lambda: urllib.request.urlopen(request, timeout=120).read(), timeout=600)
        return {"seconds": time.perf_counter() - started}
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)

    artifact = build_artifact(work)
    watch = LoadWatch(len(os.sched_getaffinity(0)))
    files = [p for p in artifact.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    # Blobs are content-addressed: identical files (the export's weights and the ORT engine's,
    # when the optimizer leaves initializers alone) travel and are stored once.
    unique = sum({sha256_file(p): p.stat().st_size for p in files}.values())
    cp, push, pull, ttft = _measure(artifact, work, args, unique, watch)
    refused = watch.refusal()
    report = {
        "benchmark": "registry",
        "artifact": {
            "files": len(files),
            "bytes": total,
            "unique_blob_bytes": unique,
            "largest_file_bytes": max(p.stat().st_size for p in files),
            "config": CONFIG,
        },
        "registry": f"docker-registry ({_registry_version(args.registry_bin)}) on 127.0.0.1, "
        "filesystem storage",
        "cp": _rate(cp, total, total),
        "push": _rate(push, total, unique),
        "pull": _rate(pull, total, unique),
        "serve_time_to_first_token": ttft,
        "sha256_mb_per_s": _sha256_rate(),
        "load_average_1min": {"before": watch.samples[0], "after": watch.samples[-1]},
        "machine": machine_info(),
        "load": watch.record(),
        "refused": refused,
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ingot-bench")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--registry-bin",
        default=REGISTRY_BIN,
        metavar="PATH",
        help="the docker-registry (distribution) binary (default: %(default)s)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, metavar="DIR")
    add_report_only(parser)
    return parser.parse_args(argv)


def _measure(
    artifact: Path, work: Path, args: argparse.Namespace, unique: int, watch: LoadWatch
) -> tuple[list[float], list[float], list[float], dict[str, Any]]:
    """Seconds of each run's cp, push (into a fresh registry) and pull (into an empty store);
    then the time to first token of a server on an empty store and on the populated one."""
    cp, push, pull = [], [], []
    registries = []
    try:
        for run in range(args.repeats):
            cp.append(time_cp(artifact, work))
            seconds, reference, registry = time_push(artifact, work, run, args.registry_bin)
            push.append(seconds)
            registries.append(registry)
            seconds, downloaded = time_pull(reference, work, run)
            assert downloaded >= unique, (downloaded, unique)
            pull.append(seconds)
            watch.sample()
        warm_store = work / "store-serve"
        shutil.rmtree(warm_store, ignore_errors=True)
        cold = time_to_first_token(reference, warm_store)  # empty store: pull, verify, load
        warm = time_to_first_token(reference, warm_store)  # store populated: verify, load
    finally:
        for registry in registries:
            registry.stop()
            shutil.rmtree(work / f"registry-{registries.index(registry)}", ignore_errors=True)
        shutil.rmtree(work / "store-serve", ignore_errors=True)
    return cp, push, pull, {"cold_store": cold, "warm_store": warm}


def _rate(seconds: list[float], total: int, moved: int) -> dict[str, Any]:
    best = min(seconds)
    return {
        "seconds": seconds,
        "best_seconds": best,
        "artifact_mb_per_s": total / 1e6 / best,  # the artifact's size over the time
        "moved_bytes": moved,
        "moved_mb_per_s": moved / 1e6 / best,  # the bytes actually copied or sent
    }


def _markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    a = r["artifact"]
    rows = [
        ("`cp -r` (+ sync)", r["cp"]),
        ("`ingot push` (fresh registry)", r["push"]),
        ("`ingot pull --out` (empty store)", r["pull"]),
    ]
    lines = [
        "# Registry benchmark",
        "",
        f"Artifact: {a['bytes'] / 1e9:.2f} GB in {a['files']} files (largest "
        f"{a['largest_file_bytes'] / 1e9:.2f} GB), a real build of a random-weight fp32 Llama "
        f"({a['config']['num_hidden_layers']} layers, hidden {a['config']['hidden_size']}, "
        f"vocab {a['config']['vocab_size']}). Registry: {r['registry']}.",
        "",
        f"The two weight files are identical ({a['unique_blob_bytes'] / 1e9:.2f} GB of unique "
        "blobs), so push and pull move each once: *artifact MB/s* is the artifact's size over "
        "the time, *moved MB/s* the bytes actually copied or sent.",
        "",
        "| operation | best s | artifact MB/s | moved MB/s | all runs (s) |",
        "|---|---:|---:|---:|---|",
    ]
    for name, stats in rows:
        runs = ", ".join(f"{s:.2f}" for s in stats["seconds"])
        lines.append(
            f"| {name} | {stats['best_seconds']:.2f} | {stats['artifact_mb_per_s']:.0f} | "
            f"{stats['moved_mb_per_s']:.0f} | {runs} |"
        )
    ttft = r["serve_time_to_first_token"]
    lines += [
        "",
        "Time to first token of `ingot serve oci://…@sha256:…` (process start to the first "
        "completion token of a 1-token request):",
        "",
        "| store | seconds |",
        "|---|---:|",
        f"| cold (empty: pull + verify + load) | {ttft['cold_store']['seconds']:.2f} |",
        f"| warm (already pulled: verify + load) | {ttft['warm_store']['seconds']:.2f} |",
        "",
        f"Machine: {m['cpu_model']}, {m['usable_cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB "
        f"RAM, {m['platform']}, Python {m['python']}, {m['date']}. 1-minute load average "
        f"{r['load_average_1min']['before']:.1f} before, {r['load_average_1min']['after']:.1f} "
        "after (other work shared the cores: treat the numbers as a floor).",
        "",
        "Push and pull include verifying the artifact (sha256 of every file), hashing every blob "
        "as it streams, and `sync`; pull also includes materializing (hard links) and verifying "
        f"the result. sha256 runs at {r['sha256_mb_per_s']:.0f} MB/s on this host, so a pull "
        "spends about (unique bytes + artifact bytes) / that rate hashing, and the registry "
        "hashes what it receives too (on the same cores). All data was in the page cache; "
        "each command's time includes its Python start-up (about 1 s).",
        "",
    ]
    return "\n".join(lines)


def _sha256_rate() -> float:
    """This host's hashlib sha256 speed: push verifies every file, pull hashes every blob as it
    streams and then verifies the laid-out directory, so it bounds both."""
    data = bytes(64 << 20)
    digest = hashlib.sha256()
    started = time.perf_counter()
    for _ in range(8):
        digest.update(data)
    return 8 * len(data) / 1e6 / (time.perf_counter() - started)


def _ingot_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run([*INGOT, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ingot {args[0]} failed: {done.stderr}")
    return json.loads(done.stdout)


def _registry_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return done.stdout.strip().split()[-1] if done.returncode == 0 else "unknown"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(probe, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
