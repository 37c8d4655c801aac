"""What ONNX Runtime's CPU kernels allow on this host: the ceilings under issue 11's targets.

Reproduce (about 3 minutes on 2 cores; writes benchmarks/results/kernel_ceiling.json and
kernel_ceiling.md; a run whose host load exceeded the thread count is refused):

    .venv/bin/python -m benchmarks.decode.kernel_ceiling [--threads 2] [--out-dir DIR]
        [--report-only]

Every case is a small synthetic graph run by ONNX Runtime alone (no ingot code on the timed
path), median of interleaved repeats, so a ceiling is a property of ORT on this CPU:

- `matmulnbits`: one decode step's linears of the Llama-3.2-1B shape (hidden 2048, 8 KV heads
  of 64, MLP 8192; q|k|v, o, gate|up, down: ingot's fused layout), int4 g32 symmetric, as
  MatMulNBits at M = 1, for 4 layers (235 MB: far past the 32 MB L3); weight bytes read per
  second against the host's DRAM read bandwidth (benchmarks/harness/machine.py), per accuracy level
  (0: fp32 activations; 4: int8, the default) and intra-op thread count. ingot's whole 1B
  decode step cannot reach a larger fraction of the bound than its linears' kernel does.
- `node_overhead`: a chain of Add nodes on a [1, 384] row: what ORT's executor costs per node
  when the kernel does almost nothing (pydoc-16m's engine graph has 173 nodes).
- `kv_in_place`: ScatterND of 16 new rows into a 256 MiB KV pool bound as the graph input, its
  output bound (IOBinding) to the same memory, then a Gather of the written rows: whether the
  rows land in place and the Gather sees them, and the time against an output in a separate
  buffer (a whole-pool copy per call). This is the in-place KV write an engine graph could use
  instead of concatenating each layer's new K/V to its gathered past.
- `attention_path`: one layer's paged attention for 32 sequences of 250 past tokens (pydoc-16m's
  heads: 6 query, 2 KV, head dim 64; blocks of 16), K and V each: as the engine does it today
  (Gather the blocks, Reshape, Concat the new token, Attention) against the in-place form
  (ScatterND the new token into the pool, Gather, Reshape, Attention: no Concat). Both
  sessions run with intra-op spinning off: with it on, the idle session's threads spin on the
  cores the other's call needs, and the two cases' times swung by 2x from run to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.harness.load import LoadWatch, load_line
from benchmarks.harness.machine import machine_info, measure_bandwidth
from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import add_report_only, publish, rerender
from benchmarks.harness.rounds import interleave

STEM = "kernel_ceiling"

# Llama-3.2-1B's decode linears, ingot's fused layout: (name, K, N).
LINEARS_1B = (
    ("qkv", 2048, 3072),
    ("o", 2048, 2048),
    ("gate_up", 2048, 16384),
    ("down", 8192, 2048),
)
LAYERS = 4  # 4 x 58.7 MB of codes and scales: far past the L3
GROUP = 32
REPEATS = 15  # interleaved rounds; the median is reported
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        return rerender(args.out_dir, STEM, _markdown)
    watch = LoadWatch(args.threads)
    started = time.perf_counter()
    report: dict[str, Any] = {"benchmark": "kernel_ceiling", "machine": machine_info()}
    report["bandwidth"] = measure_bandwidth(args.threads)
    watch.sample()
    report["matmulnbits"] = _matmulnbits(args.threads)
    watch.sample()
    report["node_overhead"] = _node_overhead(args.threads)
    watch.sample()
    report["kv_in_place"] = _kv_in_place(args.threads)
    watch.sample()
    report["attention_path"] = _attention_path(args.threads)
    report["load"] = watch.record()
    report["refused"] = watch.refusal()
    report["duration_s"] = round(time.perf_counter() - started, 1)
    return publish(report, args.out_dir, STEM, _markdown)


def _session(
    nodes: list, inputs: list, outputs: list, inits: list, threads: int, spin: bool = True
) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _timed(cases: dict[str, Callable[[], Any]], calls: int) -> dict[str, float]:
    """Median seconds per call of each case, the cases interleaved round by round (this host's
    speed drifts by tens of percent over minutes; interleaving keeps the ratios)."""
    for run in cases.values():
        for _ in range(3):
            run()

    def timed(name: str, _: int) -> float:
        run = cases[name]
        # One untimed call first: another session's pool threads spin for a while after its
        # calls, and would take a core from this case's first timed call.
        time.sleep(0.01)
        run()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        return (time.perf_counter() - start) / calls

    times = interleave(list(cases), REPEATS, timed, rotate=False)
    return {name: float(np.median(t)) for name, t in times.items()}


def matmulnbits_node(prefix: str, k: int, n: int, accuracy_level: int) -> Any:
    """An int4 g32 `MatMulNBits` node: input `x{k}` [M, K], initializers `{prefix}.codes`
    [N, K/32, 16] and `{prefix}.scales` [N * K/32], output `{prefix}.y` [M, N]."""
    return helper.make_node(
        "MatMulNBits",
        [f"x{k}", f"{prefix}.codes", f"{prefix}.scales"],
        [f"{prefix}.y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=GROUP,
        accuracy_level=accuracy_level,
    )


def _matmulnbits(threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = {k: rng.standard_normal((1, k), dtype=np.float32) for k in {k for _, k, _ in LINEARS_1B}}
    cases, weight_bytes = {}, 0
    for level in (0, 4):
        nodes, inits, outputs, weight_bytes = [], [], [], 0
        for layer in range(LAYERS):
            for name, k, n in LINEARS_1B:
                blocks = k // GROUP
                codes = rng.integers(0, 256, (n, blocks, GROUP // 2), dtype=np.uint8)
                scales = rng.random(n * blocks, dtype=np.float32) * 0.01
                prefix = f"l{layer}.{name}"
                inits += [
                    numpy_helper.from_array(codes, f"{prefix}.codes"),
                    numpy_helper.from_array(scales, f"{prefix}.scales"),
                ]
                weight_bytes += codes.nbytes + scales.nbytes
                nodes.append(matmulnbits_node(prefix, k, n, level))
                outputs.append(helper.make_tensor_value_info(f"{prefix}.y", F, [1, n]))
        inputs = [helper.make_tensor_value_info(f"x{k}", F, [1, k]) for k in x]
        feeds = {f"x{k}": v for k, v in x.items()}
        for t in sorted({1, threads}):
            session = _session(nodes, inputs, outputs, inits, t)
            name = f"level {level}, {t} thread{'s' if t > 1 else ''}"
            cases[name] = lambda s=session, f=feeds: s.run(None, f)
        del nodes, inits
    # The bound, timed in the same rounds (this host's bandwidth drifts with its neighbours):
    # bytes read / s of a sum over 1 GiB, measure_bandwidth's best read-only method.
    big = torch.ones(1 << 28)
    cases["bandwidth"] = big.sum
    seconds = _timed(cases, calls=3)
    bandwidth = big.numel() * 4 / seconds.pop("bandwidth")
    del big
    rows = [
        {
            "case": name,
            "ms_per_step": round(s * 1e3, 3),
            "weight_gb_per_s": round(weight_bytes / s / 1e9, 2),
            "fraction_of_bound": round(weight_bytes / s / bandwidth, 3),
        }
        for name, s in seconds.items()
    ]
    return {
        "layers": LAYERS,
        "weight_bytes": weight_bytes,
        "bandwidth_bytes_per_s": bandwidth,
        "rows": rows,
    }


def _node_overhead(threads: int) -> dict[str, Any]:
    width, counts = 384, (1, 173, 346)
    one = numpy_helper.from_array(np.ones((1, width), np.float32), "one")
    x = np.ones((1, width), np.float32)
    cases = {}
    for count in counts:
        nodes = [
            helper.make_node("Add", ["x" if i == 0 else f"y{i - 1}", "one"], [f"y{i}"])
            for i in range(count)
        ]
        io = [helper.make_tensor_value_info("x", F, [1, width])]
        out = [helper.make_tensor_value_info(f"y{count - 1}", F, [1, width])]
        session = _session(nodes, io, out, [one], threads)
        cases[count] = lambda s=session: s.run(None, {"x": x})
    seconds = _timed(cases, calls=200)
    per_node = (seconds[counts[-1]] - seconds[counts[0]]) / (counts[-1] - counts[0])
    return {
        "rows": [{"nodes": n, "us_per_run": round(s * 1e6, 1)} for n, s in seconds.items()],
        "us_per_node": round(per_node * 1e6, 3),
    }


def _kv_in_place(threads: int) -> dict[str, Any]:
    slots, width, rows = (256 << 20) // (128 * 4), 128, 16  # a 256 MiB pool of [slots, 128]
    nodes = [
        helper.make_node("ScatterND", ["pool", "index", "rows"], ["pool_out"]),
        helper.make_node("Gather", ["pool_out", "read"], ["seen"], axis=0),
    ]
    inputs = [
        helper.make_tensor_value_info("pool", F, [slots, width]),
        helper.make_tensor_value_info("index", I64, [rows, 1]),
        helper.make_tensor_value_info("rows", F, [rows, width]),
        helper.make_tensor_value_info("read", I64, [rows]),
    ]
    outputs = [
        helper.make_tensor_value_info("pool_out", F, [slots, width]),
        helper.make_tensor_value_info("seen", F, [rows, width]),
    ]
    session = _session(nodes, inputs, outputs, [], threads)
    pool = np.zeros((slots, width), np.float32)
    index = np.random.default_rng(0).choice(slots, rows, replace=False).astype(np.int64)
    new = np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 1
    seen = np.empty((rows, width), np.float32)
    elsewhere = np.empty_like(pool)
    bindings = {}
    for target in ("pool", "separate"):
        binding = session.io_binding()
        binding.bind_ortvalue_input("pool", ort.OrtValue.ortvalue_from_numpy(pool))
        binding.bind_cpu_input("index", index[:, None].copy())
        binding.bind_cpu_input("rows", new)
        binding.bind_cpu_input("read", index)
        out = pool if target == "pool" else elsewhere
        binding.bind_output("pool_out", "cpu", 0, np.float32, list(pool.shape), out.ctypes.data)
        binding.bind_output("seen", "cpu", 0, np.float32, [rows, width], seen.ctypes.data)
        bindings[target] = binding
    session.run_with_iobinding(bindings["pool"])
    written = bool(np.array_equal(pool[index], new)) and bool(np.array_equal(seen, new))
    seconds = _timed(
        {t: (lambda b=b: session.run_with_iobinding(b)) for t, b in bindings.items()}, calls=20
    )
    return {
        "pool_bytes": pool.nbytes,
        "rows_written": rows,
        "in_place_rows_written_and_gathered": written,
        "us_output_is_the_pool": round(seconds["pool"] * 1e6, 1),
        "us_output_separate": round(seconds["separate"] * 1e6, 1),
    }


def _attention_path(threads: int) -> dict[str, Any]:
    seqs, past, block, hq, hkv, d = 32, 250, 16, 6, 2, 64
    per_seq = -(-(past + 1) // block)  # blocks of the past and the new token: the same 16
    num_blocks = seqs * per_seq + 1
    rng = np.random.default_rng(0)
    pools = {k: rng.standard_normal((num_blocks, block, hkv, d), dtype=np.float32) for k in "kv"}
    tables = (1 + np.arange(seqs * per_seq, dtype=np.int64)).reshape(seqs, per_seq)
    feeds = {
        "q": rng.standard_normal((seqs, 1, hq * d), dtype=np.float32),
        "k_new": rng.standard_normal((seqs, 1, hkv * d), dtype=np.float32),
        "v_new": rng.standard_normal((seqs, 1, hkv * d), dtype=np.float32),
    }
    concat, in_place = _attention_sessions(seqs, (hq, hkv, d), list(pools["k"].shape), threads)
    # Today: the tables list the past's blocks; the new token is the mask's last slot.
    past_tables = tables[:, : -(-past // block)].copy()
    concat_mask = np.zeros((seqs, 1, 1, past_tables.shape[1] * block + 1), bool)
    concat_mask[..., :past] = concat_mask[..., -1] = True
    # In place: the new token's slot (position `past`) is in its sequence's table.
    where = [tables[:, past // block], np.full(seqs, past % block, np.int64)]
    slots = np.stack(where, axis=1)[:, None, :].copy()  # [S, 1, 2]: block, offset
    in_place_mask = np.zeros((seqs, 1, 1, per_seq * block), bool)
    in_place_mask[..., : past + 1] = True
    y_out = np.empty((seqs, 1, hq * d), np.float32)
    bindings = {}
    for name, session, table, mask in (
        ("gather + concat (today)", concat, past_tables, concat_mask),
        ("scatter in place + gather", in_place, tables, in_place_mask),
    ):
        binding = session.io_binding()
        for k in "kv":
            binding.bind_ortvalue_input(f"{k}_pool", ort.OrtValue.ortvalue_from_numpy(pools[k]))
            if session is in_place:
                binding.bind_output(
                    f"{k}_out", "cpu", 0, np.float32, list(pools[k].shape), pools[k].ctypes.data
                )
        for feed, value in {**feeds, "tables": table, "mask": mask}.items():
            binding.bind_cpu_input(feed, value)
        if session is in_place:
            binding.bind_cpu_input("slots", slots)
        binding.bind_output("y", "cpu", 0, np.float32, list(y_out.shape), y_out.ctypes.data)
        bindings[name] = (session, binding)
    seconds = _timed(
        {n: (lambda s=s, b=b: s.run_with_iobinding(b)) for n, (s, b) in bindings.items()}, 20
    )
    return {
        "sequences": seqs,
        "past_tokens": past,
        "rows": [{"case": n, "us_per_layer": round(s * 1e6, 1)} for n, s in seconds.items()],
    }


def _attention_sessions(
    seqs: int, heads: tuple[int, int, int], pool_shape: list[int], threads: int
) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """One layer's paged attention over K and V pools of `pool_shape` [blocks, B, Hkv, D] for
    `seqs` sequences of one new token, `heads` (query heads, KV heads, head dim): as the engine
    does it today (Gather, Reshape, Concat the new token) and in place (ScatterND the new token
    into the pool, Gather, Reshape), both with intra-op spinning off."""
    hq, hkv, d = heads
    shape = numpy_helper.from_array(np.array([0, -1, hkv * d], np.int64), "shape")
    attention = dict(q_num_heads=hq, kv_num_heads=hkv, scale=1 / 8)

    def io(name: str, dtype: int, dims: list) -> Any:
        return helper.make_tensor_value_info(name, dtype, dims)

    common = [io("q", F, [seqs, 1, hq * d]), io("k_new", F, [seqs, 1, hkv * d])]
    common += [io("v_new", F, [seqs, 1, hkv * d]), io("tables", I64, None), io("mask", B, None)]
    common += [io(f"{k}_pool", F, pool_shape) for k in "kv"]
    y = io("y", F, [seqs, 1, hq * d])
    concat_nodes, in_place_nodes = [], []
    for k in "kv":
        concat_nodes += [
            helper.make_node("Gather", [f"{k}_pool", "tables"], [f"{k}_g"], axis=0),
            helper.make_node("Reshape", [f"{k}_g", "shape"], [f"{k}_past"]),
            helper.make_node("Concat", [f"{k}_past", f"{k}_new"], [f"{k}_all"], axis=1),
        ]
        in_place_nodes += [
            helper.make_node("Reshape", [f"{k}_new", "rows"], [f"{k}_rows"]),
            helper.make_node("ScatterND", [f"{k}_pool", "slots", f"{k}_rows"], [f"{k}_out"]),
            helper.make_node("Gather", [f"{k}_out", "tables"], [f"{k}_g"], axis=0),
            helper.make_node("Reshape", [f"{k}_g", "shape"], [f"{k}_all"]),
        ]
    for nodes in (concat_nodes, in_place_nodes):
        nodes.append(
            helper.make_node("Attention", ["q", "k_all", "v_all", "mask"], ["y"], **attention)
        )
    concat = _session(concat_nodes, common, [y], [shape], threads, spin=False)
    rows_shape = numpy_helper.from_array(np.array([seqs, 1, hkv, d], np.int64), "rows")
    outs = [io(f"{k}_out", F, pool_shape) for k in "kv"]
    in_place = _session(
        in_place_nodes,
        [*common, io("slots", I64, [seqs, 1, 2])],
        [y, *outs],
        [shape, rows_shape],
        threads,
        spin=False,
    )
    return concat, in_place


def _markdown(report: dict[str, Any]) -> str:
    m, bw = report["machine"], report["bandwidth"]
    lines = [
        "# Kernel ceilings: what ONNX Runtime's CPU kernels allow on this host",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores; onnxruntime "
        f"{m['versions']['onnxruntime']}. `.venv/bin/python -m benchmarks.decode.kernel_ceiling` "
        f"({report['duration_s']} s). Medians of {REPEATS} interleaved rounds.",
        "",
        "DRAM read bandwidth at the start (benchmarks/harness/machine.py): "
        f"{bw['bytes_per_s'] / 1e9:.1f} "
        f"GB/s ({bw['bound_method']}).",
        "",
        "## MatMulNBits at M = 1: the 1B shape's decode linears",
        "",
        f"{report['matmulnbits']['layers']} layers of q|k|v, o, gate|up and down (int4 g32), "
        f"{report['matmulnbits']['weight_bytes'] / 1e6:.0f} MB of codes and scales per step. "
        "The bound: a 1 GiB torch sum on the same threads, timed in the same rounds: "
        f"{report['matmulnbits']['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s.",
        "",
        "| case | ms per step | weight GB/s | of the bandwidth bound |",
        "|---|---:|---:|---:|",
    ]
    for r in report["matmulnbits"]["rows"]:
        lines.append(
            f"| {r['case']} | {r['ms_per_step']} | {r['weight_gb_per_s']} | "
            f"{r['fraction_of_bound']:.2f} |"
        )
    no = report["node_overhead"]
    lines += [
        "",
        "## ORT's cost per node",
        "",
        "| Add nodes on [1, 384] | µs per run |",
        "|---:|---:|",
        *[f"| {r['nodes']} | {r['us_per_run']} |" for r in no["rows"]],
        "",
        f"About {no['us_per_node']} µs per node.",
    ]
    kv = report["kv_in_place"]
    lines += [
        "",
        "## ScatterND into the KV pool, output bound to the pool",
        "",
        f"{kv['rows_written']} rows into a {kv['pool_bytes'] >> 20} MiB pool. Written in place "
        f"and seen by a Gather after it: **{kv['in_place_rows_written_and_gathered']}**. "
        f"{kv['us_output_is_the_pool']} µs per call with the output bound to the pool's memory, "
        f"{kv['us_output_separate']} µs with a separate output (a copy of the whole pool).",
    ]
    ap = report["attention_path"]
    lines += [
        "",
        f"## One layer's paged attention, {ap['sequences']} sequences x {ap['past_tokens']} "
        "past tokens, one new token each",
        "",
        "| K and V path | µs per layer |",
        "|---|---:|",
        *[f"| {r['case']} | {r['us_per_layer']} |" for r in ap["rows"]],
        "",
        load_line(report["load"], report["refused"]),
        "",
    ]
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    add_report_only(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
