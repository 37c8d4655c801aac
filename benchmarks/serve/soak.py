"""Soak: `ingot serve` on the demo artifact under ten minutes of mixed traffic at its capacity,
normal and hostile, with a probe stream timing the gaps between its tokens.

    .venv/bin/python -m benchmarks.serve.soak [--minutes 10] [--artifact DIR]
        [--max-num-seqs 8] [--threads N] [--out-dir benchmarks/results] [--report-only]

The server runs as a user runs it (the `ingot serve` command, its default timeouts) with
--max-num-seqs requests at once; the traffic fills them: --max-num-seqs - 1 workers of normal
requests (completions and chats, streamed or not) and the probe, plus one worker each of
cancelled requests, malformed ones (broken JSON, wrong types, smuggling-style framing, ...),
oversized bodies (17 MB declared or chunked: 413; 9 MB prompts: 400), slow clients (headers
trickled: 408; a ~1 KB/s upload: served) and idle connections (closed by keep-alive).

Phases: start the server; warm up (normal traffic at capacity, so the allocators reach their
working size); settle; resident memory `start`; the probe alone on the idle server; the probe
beside normal traffic at capacity (`quiet`: no hostile traffic); the soak; settle; resident
memory `end`; SIGTERM (its exit status). It passes when: no 5xx, no accepted request left
unanswered (nor a stream cut or ended by an error event), no traceback in the server's log,
resident memory back within 10% of `start`, and the probe's p99 gap during the soak within
2x of its quiet p99. Quiet is the full server without the hostile traffic: a full batch
makes every step longer whatever else comes, so the idle server's gaps (reported too) would
measure batching, not the hostile clients.
Gaps are between the probe's SSE events as the client reads them (vLLM's benchmark's ITL).

An artifact without a chat template (the demo before it had one) is served with a one-line
template (--chat-template), so chat requests exercise the chat route. Without --artifact the
demo recipe is built first (seconds). A run whose host load exceeded the thread count + 1 is
written REFUSED and exits 1 (benchmarks/harness/load.py), counting one thread more than the
server's for the traffic this process sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.serve.server import ServerProcess, free_port
from benchmarks.serve.soak_traffic import Probe, Traffic

STEM = "soak"
INGOT = str(Path(sys.executable).parent / "ingot")
KEEP_ALIVE_S = 5.0  # ingot serve's default --keep-alive-timeout
WARM_UP_S = 30.0
IDLE_PROBE_S = 20.0
QUIET_S = 60.0
SETTLE_S = 10.0
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
PROBE = {"prompt": "The os module", "max_tokens": 256, "ignore_eos": True, "temperature": 0}
PROBE["stream"] = True
# How often each hostile worker acts (seconds between its requests, randomized +-50%).
PAUSES = {"malformed": 0.2, "oversized": 4.0, "slow_upload": 1.0, "idle": 1.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak")
    parser.add_argument("--artifact", type=Path, default=None, help="default: build the demo")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    # The server's threads and, beside them at capacity, this process's HTTP clients: the soak
    # alone holds the 1-min load near 2.9 on 2 cores (a run with nothing else on the host).
    watch = LoadWatch(args.threads + 1)
    with tempfile.TemporaryDirectory() as tmp:
        artifact = args.artifact or _build_demo(Path(tmp))
        with watch.sampling(every_s=15):
            results = _soak(artifact, Path(tmp), args)
    refused = watch.refusal()
    report = {
        "machine": machine_info(),
        "settings": {
            "minutes": args.minutes,
            "max_num_seqs": args.max_num_seqs,
            "warm_up_s": WARM_UP_S,
            "idle_probe_s": IDLE_PROBE_S,
            "quiet_s": QUIET_S,
            "settle_s": SETTLE_S,
            "probe": PROBE,
            "pauses_s": PAUSES,
        },
        "results": results,
        "verdict": _verdict(results),
        "load": watch.record(),
        "refused": refused,
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _build_demo(tmp: Path) -> Path:
    out = tmp / "demo"
    recipe = REPO / "recipes" / "demo.yaml"
    env = {**os.environ, "INGOT_CACHE_DIR": str(tmp / "cache")}
    subprocess.run(
        [INGOT, "build", "--recipe", str(recipe), "--out", str(out)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return out


def _soak(artifact: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [INGOT, "serve", str(artifact), "--port", str(port)]
    command += ["--max-num-seqs", str(args.max_num_seqs), "--max-queue", "64"]
    template = _chat_template(artifact, tmp)
    command += template
    server = ServerProcess(command, tmp / "server.log")
    server.start(base_url, timeout_s=300)
    pid = server.process.pid
    rss: dict[str, float] = {"launch": _rss_mb(pid)}
    try:
        prompts = _prompts()
        _phase(port, prompts, WARM_UP_S, args.max_num_seqs, hostile=False)
        time.sleep(SETTLE_S)
        rss["start"] = _rss_mb(pid)
        idle = asyncio.run(_probe_alone(base_url, IDLE_PROBE_S))
        quiet_traffic, quiet = _phase(port, prompts, QUIET_S, args.max_num_seqs, hostile=False)
        rss["before_soak"] = _rss_mb(pid)
        peak = _RssPeak(pid)
        soak_traffic, probe = _phase(
            port, prompts, args.minutes * 60, args.max_num_seqs, hostile=True, peak=peak
        )
        time.sleep(SETTLE_S)
        rss["peak"] = max(peak.series)
        rss["end"] = _rss_mb(pid)
        leftovers = _running_and_waiting(base_url)
    finally:
        exit_status = server.stop()
    log = (tmp / "server.log").read_text(errors="replace")
    return {
        "chat_template": "fallback (--chat-template)" if template else "the artifact's",
        "rss_mb": rss,
        "rss_mb_every_10s_of_soak": peak.series[::10],
        "idle_probe": _gap_summary(idle),
        "quiet_probe": _gap_summary(quiet),
        "quiet_tally": quiet_traffic.tally.as_dict(),
        "soak_probe": _gap_summary(probe),
        "tally": soak_traffic.tally.as_dict(),
        "requests_left_running_or_waiting": leftovers,
        "server_exit_status": exit_status,
        "server_log_tracebacks": log.count("Traceback"),
        "server_log_errors": [line for line in log.splitlines() if "ERROR" in line][:20],
        "server_log_first_tracebacks": _tracebacks(log)[:3],
    }


def _tracebacks(log: str) -> list[str]:
    """Each traceback in the server's log, its last 40 lines (what raised, and where)."""
    found = []
    for piece in log.split("Traceback (most recent call last):")[1:]:
        lines = piece.splitlines()
        end = next((i for i, line in enumerate(lines) if line and not line[0].isspace()), 0)
        found.append("\n".join(lines[max(0, end - 39) : end + 1]))
    return found


def _phase(
    port: int,
    prompts: list[str],
    seconds: float,
    max_num_seqs: int,
    *,
    hostile: bool,
    peak: _RssPeak | None = None,
) -> tuple[Traffic, Probe]:
    """One phase of traffic (`_run_for`) with its own tally."""
    traffic = Traffic(port, prompts, KEEP_ALIVE_S)
    probe = asyncio.run(_run_for(traffic, seconds, max_num_seqs, hostile=hostile, peak=peak))
    return traffic, probe


async def _run_for(
    traffic: Traffic,
    seconds: float,
    max_num_seqs: int,
    *,
    hostile: bool,
    peak: _RssPeak | None = None,
) -> Probe:
    """`max_num_seqs - 1` normal workers and the probe for `seconds` (and, if `hostile`, the
    hostile workers); the probe."""
    limits = httpx.Limits(max_connections=4 * max_num_seqs)
    timeout = httpx.Timeout(120.0)
    async with (
        httpx.AsyncClient(base_url=traffic.base_url, timeout=timeout, limits=limits) as client,
        httpx.AsyncClient(base_url=traffic.base_url, timeout=timeout) as probe_client,
    ):
        probe = Probe()
        workers = [traffic.loop(lambda: traffic.normal(client)) for _ in range(max_num_seqs - 1)]
        workers.append(probe.run(probe_client, PROBE, lambda: traffic.stopping))
        if hostile:
            workers += [
                traffic.loop(lambda: traffic.cancelled(client), 0.5),
                traffic.loop(traffic.malformed, PAUSES["malformed"]),
                traffic.loop(traffic.oversized, PAUSES["oversized"]),
                traffic.loop(traffic.slowloris),
                traffic.loop(traffic.slow_upload, PAUSES["slow_upload"]),
                traffic.loop(traffic.idle, PAUSES["idle"]),
            ]
        tasks = [asyncio.ensure_future(w) for w in workers]
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            await asyncio.sleep(1.0)
            if peak is not None:
                peak.sample()
        traffic.stop()
        await asyncio.gather(*tasks)
    return probe


async def _probe_alone(base_url: str, seconds: float) -> Probe:
    probe = Probe()
    ends = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as client:
        await probe.run(client, PROBE, lambda: time.monotonic() >= ends)
    return probe


def _chat_template(artifact: Path, tmp: Path) -> list[str]:
    """`--chat-template FILE` for an artifact without a template, else nothing."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    if manifest["tokenizer"].get("chat_template"):
        return []
    path = tmp / "chat_template.jinja"
    path.write_text(FALLBACK_TEMPLATE)
    return ["--chat-template", str(path)]


def _prompts() -> list[str]:
    """Pieces of the demo model's own text, 60-400 characters."""
    text = (REPO / "recipes" / "demo" / "pydoc-heldin.txt").read_text(encoding="utf-8")
    pieces, position = [], 0
    for length in (60, 120, 200, 400) * 16:
        pieces.append(text[position : position + length])
        position += length
    return pieces


class _RssPeak:
    """The server's resident memory, sampled each second of the soak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.series: list[float] = []

    def sample(self) -> None:
        self.series.append(round(_rss_mb(self.pid), 1))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _running_and_waiting(base_url: str) -> dict[str, float]:
    """vLLM's gauges after the traffic: requests the server still holds (leaks if not 0)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


def _gap_summary(probe: Probe) -> dict[str, Any]:
    gaps = sorted(probe.gaps)
    if not gaps:
        return {"gaps": 0, "streams": probe.streams, "failures": probe.failures[:10]}

    def pct(q: float) -> float:
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3

    return {
        "gaps": len(gaps),
        "streams": probe.streams,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": gaps[-1] * 1e3,
        "failures": probe.failures[:10],
    }


def _verdict(results: dict[str, Any]) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for counts in results["tally"].values():
        for outcome, n in counts.items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
    server_errors = sum(n for o, n in outcomes.items() if o.isdigit() and o.startswith("5"))
    unanswered = sum(outcomes.get(o, 0) for o in ("unanswered", "stream_cut", "stream_error"))
    rss = results["rss_mb"]
    quiet, soak = results["quiet_probe"], results["soak_probe"]
    ratio = soak["p99_ms"] / quiet["p99_ms"] if quiet.get("p99_ms") and soak.get("p99_ms") else None
    memory = abs(rss["end"] - rss["start"]) / rss["start"]
    checks = {
        "no_5xx": server_errors == 0,
        "no_unanswered": unanswered == 0 and not soak.get("failures"),
        "memory_within_10pct": memory <= 0.10,
        "probe_p99_within_2x": ratio is not None and ratio <= 2.0,
        "nothing_left_running": not any(results["requests_left_running_or_waiting"].values()),
        "clean_exit": results["server_exit_status"] == 0,
        "no_server_tracebacks": results["server_log_tracebacks"] == 0,
    }
    return {
        "requests": sum(outcomes.values()),
        "outcomes": dict(sorted(outcomes.items())),
        "server_errors": server_errors,
        "unanswered": unanswered,
        "memory_change": memory,
        "probe_p99_ratio": ratio,
        "checks": checks,
        "passed": all(checks.values()),
    }


def _markdown(report: dict) -> str:
    s, r, v = report["settings"], report["results"], report["verdict"]
    rss, quiet, soak = r["rss_mb"], r["quiet_probe"], r["soak_probe"]
    ratio = v["probe_p99_ratio"]
    lines = [
        f"# Soak: {s['minutes']:g} minutes of mixed traffic against `ingot serve` (demo)",
        "",
        f"{report['machine']['cpu_model']}, {report['machine']['usable_cores']} cores; "
        f"--max-num-seqs {s['max_num_seqs']}: {s['max_num_seqs'] - 1} normal workers + the probe "
        "fill it, beside the hostile workers.",
        "",
        f"**{'PASSED' if v['passed'] else 'FAILED'}**: {v['requests']} requests.",
        "",
        "| check | result | |",
        "|---|---|---|",
        f"| no 5xx | {v['server_errors']} | {_ok(v['checks']['no_5xx'])} |",
        f"| no accepted request unanswered (nor a stream cut or errored) | {v['unanswered']} | "
        f"{_ok(v['checks']['no_unanswered'])} |",
        f"| resident memory back within 10% of its start | {rss['start']:.0f} MB -> "
        f"{rss['end']:.0f} MB ({v['memory_change']:+.1%}; at launch {rss['launch']:.0f} MB, "
        f"{rss['before_soak']:.0f} MB as the soak began, peak {rss['peak']:.0f} MB) | "
        f"{_ok(v['checks']['memory_within_10pct'])} |",
        f"| probe p99 inter-token gap within 2x of quiet | {soak.get('p99_ms', 0):.1f} ms vs "
        f"{quiet.get('p99_ms', 0):.1f} ms quiet ({ratio or 0:.2f}x) | "
        f"{_ok(v['checks']['probe_p99_within_2x'])} |",
        f"| no request left running or waiting | {r['requests_left_running_or_waiting']} | "
        f"{_ok(v['checks']['nothing_left_running'])} |",
        f"| SIGTERM after the soak exits 0 | {r['server_exit_status']} | "
        f"{_ok(v['checks']['clean_exit'])} |",
        f"| no traceback in the server's log | {r['server_log_tracebacks']} | "
        f"{_ok(v['checks']['no_server_tracebacks'])} |",
        "",
        "| probe's gaps (ms) | p50 | p99 | max | gaps | streams |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {g.get('p50_ms', 0):.1f} | {g.get('p99_ms', 0):.1f} | "
            f"{g.get('max_ms', 0):.0f} | {g['gaps']} | {g['streams']} |"
            for name, g in (
                ("idle server (probe alone)", r["idle_probe"]),
                ("quiet: normal traffic at capacity", quiet),
                ("soak: normal + hostile traffic", soak),
            )
        ),
        "",
        f"Chat template: {r['chat_template']}. Server log: {r['server_log_tracebacks']} "
        f"tracebacks, {len(r['server_log_errors'])} ERROR lines.",
        "",
        "| requests | outcomes |",
        "|---|---|",
    ]
    for kind, counts in r["tally"].items():
        said = ", ".join(f"{outcome} x{n}" for outcome, n in counts.items())
        lines.append(f"| {kind} | {said} |")
    lines += ["", load_line(report["load"], report.get("refused"))]
    return "\n".join(lines) + "\n"


def _ok(passed: bool) -> str:
    return "ok" if passed else "**FAIL**"


if __name__ == "__main__":
    sys.exit(main())
