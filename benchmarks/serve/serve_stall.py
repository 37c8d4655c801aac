"""How much a huge request delays another client's stream: one client streams tokens from a
paced fake model (a fixed step time, so the gaps measure the server, not a model), and after
its fourth chunk a second client sends a 10 MB body to a route. Reports the largest gap
between the first client's chunks per route, against the same stream alone; a run whose host
load exceeded the thread count is written REFUSED and exits 1.

    .venv/bin/python -m benchmarks.serve.serve_stall [--mb 10] [--step-ms 20] [--threads N]
        [--out-dir benchmarks/results] [--report-only]

The fake model and the live server are the tests' (tests/runtime/server/server_support.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from benchmarks.harness.load import LoadWatch
from benchmarks.harness.machine import machine_info
from benchmarks.harness.paths import REPO, RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "serve_stall"
CHUNKS = 24  # tokens of the measured stream; its prompt's continuation stays ASCII


def _server_support() -> ModuleType:
    """The tests' fake model and live server. Imported here, not at the top: it is found only
    once tests/ is on the path, which only a run of this benchmark needs."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "runtime" / "server")]
    import server_support

    return server_support


def _paced(server_support: ModuleType, step_s: float) -> type:
    class Paced(server_support.FakeSession):
        def run(self, *inputs):
            time.sleep(step_s)
            return super().run(*inputs)

    return Paced


def _cases(megabytes: float) -> dict[str, tuple[str, dict] | None]:
    text = "The quick brown fox jumps over the lazy dog. "
    big = text * int(megabytes * 1e6 / len(text))
    return {
        "alone": None,
        "completion": ("/v1/completions", {"prompt": big, "max_tokens": 2}),
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}]}),
        "tokenize": ("/tokenize", {"prompt": big}),
    }


def _measure(base_url: str, prompt_ids: list[int], case: tuple[str, dict] | None) -> dict:
    big: dict[str, Any] = {}

    def send() -> None:
        started = time.perf_counter()
        response = httpx.post(base_url + case[0], json=case[1], timeout=300)
        big.update(status=response.status_code, seconds=time.perf_counter() - started)

    body = {"prompt": prompt_ids, "max_tokens": CHUNKS, "stream": True, "temperature": 0}
    gaps, sender, last = [], None, None
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=300) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: {"))
        for i, _ in enumerate(chunks):
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            if i == 3 and case is not None:
                sender = threading.Thread(target=send)
                sender.start()
    if sender is not None:
        sender.join()
    return {
        "max_gap_ms": max(gaps) * 1e3,
        "median_gap_ms": sorted(gaps)[len(gaps) // 2] * 1e3,
        "big_request": big or None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the big body (MB)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the fake model's step")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)

    watch = LoadWatch(args.threads)
    server_support = _server_support()
    server_support.FakeSession = _paced(server_support, args.step_ms / 1e3)
    with tempfile.TemporaryDirectory() as tmp:
        llm, _ = server_support.fake_llm(Path(tmp), max_queue=8)
        with server_support.LiveServer(llm) as live:
            tokenized = httpx.post(
                live.base_url + "/tokenize", json={"prompt": "a", "add_special_tokens": False}
            )
            prompt_ids = tokenized.json()["tokens"]
            results = {
                name: _measure(live.base_url, prompt_ids, case)
                for name, case in _cases(args.mb).items()
            }
    refused = watch.refusal()
    report = {
        "machine": machine_info(),
        "settings": {"mb": args.mb, "step_ms": args.step_ms, "chunks": CHUNKS},
        "load_1min": {"before": watch.samples[0], "after": watch.samples[-1]},
        "results": results,
        "load": watch.record(),
        "refused": refused,
    }
    return publish(report, args.out_dir, STEM, _markdown)


def _markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"# A {s['mb']:g} MB request beside a stream ({s['chunks']} tokens, {s['step_ms']:g} ms "
        "steps)",
        "",
        f"Host load (1 min) {report['load_1min']['before']:.1f} before, "
        f"{report['load_1min']['after']:.1f} after; {report['machine']['cpu_model']}.",
        "",
        "| big request to | stream's largest gap (ms) | median gap (ms) | big request |",
        "|---|---:|---:|---|",
    ]
    for name, r in report["results"].items():
        big = r["big_request"]
        said = "—" if big is None else f"{big['status']} after {big['seconds']:.2f} s"
        lines.append(f"| {name} | {r['max_gap_ms']:.0f} | {r['median_gap_ms']:.0f} | {said} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
