"""Every benchmark still imports and parses its arguments (`--help`), and renders each committed
report's JSON into its committed markdown. No measurement: the benchmarks take tens of minutes
on a quiet host; their renderers are what a refactor could change."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks.harness.paths import RESULTS
from benchmarks.harness.report import render

# Each benchmark: its entry module (`python -m <module>`), its reports' stems, and its renderer.
BENCHMARKS = {
    "benchmarks.decode.decode": (["decode"], "benchmarks.decode.report", "markdown"),
    "benchmarks.decode.batch1_gap": (["batch1_gap"], None, "_markdown"),
    "benchmarks.decode.prefill_split": (["prefill_split"], None, "_markdown"),
    "benchmarks.decode.kernel_ceiling": (["kernel_ceiling"], None, "_markdown"),
    "benchmarks.decode.ab_revisions": (["ab_revisions"], None, "_markdown"),
    "benchmarks.decode.whole_call": (["whole_call"], None, "_markdown"),
    "benchmarks.decode.resident": (["resident"], None, "markdown"),
    "benchmarks.decode.moe_decode": (["moe_decode"], None, "_markdown"),
    "benchmarks.serve.serve": (["serve"], "benchmarks.serve.report", "markdown"),
    "benchmarks.serve.serve_overhead": (["serve_overhead"], None, "_markdown"),
    "benchmarks.serve.serve_stall": (["serve_stall"], None, "_markdown"),
    "benchmarks.serve.soak": (["soak"], None, "_markdown"),
    "benchmarks.serve.pull": (["pull"], None, "_markdown"),
    "benchmarks.serve.serving_plan": (["serving_plan"], None, "markdown"),
    "benchmarks.serve.http_engines": (
        ["serve_engines"],
        "benchmarks.serve.http_report",
        "markdown",
    ),
    "benchmarks.quantize.quantize": (["quantize"], "benchmarks.quantize.report", "markdown"),
    "benchmarks.quantize.gptq_ablation": (
        ["gptq_ablation-pydoc-16m", "gptq_ablation-pydoc-tiny"],
        None,
        "_markdown",
    ),
    "benchmarks.quantize.fast_defaults": (["fast_defaults"], None, "_markdown"),
    "benchmarks.quantize.kv_cache": (["kv_cache"], None, "_markdown"),
    "benchmarks.quantize.w8a8_quality": (["w8a8_quality"], None, "_markdown"),
    "benchmarks.quantize.w8a8_speed": (["w8a8_speed"], None, "_markdown"),
    "benchmarks.quantize.auto_precision": (["auto_precision"], None, "_markdown"),
    "benchmarks.quantize.embedding_heads": (["embedding_heads"], None, "_markdown"),
    "benchmarks.scale.scale": (["scale", "scale-ortgenai-8b"], None, "_markdown"),
    "benchmarks.scale.registry": (["registry"], None, "_markdown"),
    "benchmarks.scale.coldstart": (["coldstart"], None, "_markdown"),
    "benchmarks.scale.artifact_bytes": (["artifact_bytes"], None, "_markdown"),
    "benchmarks.speculative.speculative": (
        ["speculative", "speculative_openvino"],
        "benchmarks.speculative.report",
        "markdown",
    ),
    "benchmarks.interop.vllm_eagle": (["interop_vllm_eagle"], None, "_markdown"),
    "benchmarks.interop.vllm_w8a8": (["interop_vllm_w8a8"], None, "_markdown"),
    "benchmarks.spike.openvino": (
        ["spike_openvino"],
        "benchmarks.spike.openvino_report",
        "markdown",
    ),
    "benchmarks.spike.kernels": (["spike_kernels"], "benchmarks.spike.kernels_report", "markdown"),
    "benchmarks.spike.llamacpp": (
        ["spike_llamacpp"],
        "benchmarks.spike.llamacpp_report",
        "markdown",
    ),
}
# Reports whose JSON was written with sorted keys, which reorders their tables (engines,
# library versions, rounds' systems) when rendered again from it: their markdown is the
# renderer's output in the order the run built, which the JSON no longer holds. The harness
# writes keys in the order built, so a report written now renders back exactly.
SORTED_JSON = {"batch1_gap", "decode", "serve", "speculative", "w8a8_speed"}
REPORTS = [(m, stem) for m, (stems, _, _) in BENCHMARKS.items() for stem in stems]


def _renderer(module: str):
    stems, renderer_module, name = BENCHMARKS[module]
    return getattr(importlib.import_module(renderer_module or module), name)


@pytest.mark.parametrize("module", BENCHMARKS)
def test_the_benchmark_parses_its_arguments(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(["--help"])
    assert done.value.code == 0
    assert "--report-only" in capsys.readouterr().out


def test_every_committed_report_belongs_to_a_benchmark() -> None:
    committed = {p.stem for p in RESULTS.glob("*.json")}
    assert committed == {stem for _, stem in REPORTS}
    assert committed == {p.stem for p in RESULTS.glob("*.md")}


@pytest.mark.parametrize(("module", "stem"), REPORTS, ids=[stem for _, stem in REPORTS])
def test_the_committed_report_renders_from_its_json(module: str, stem: str) -> None:
    report = json.loads((RESULTS / f"{stem}.json").read_text())
    text = render(report, _renderer(module))
    committed = (RESULTS / f"{stem}.md").read_text()
    if stem in SORTED_JSON:
        assert _same_words(text, committed)
    else:
        assert text == committed


def _same_words(a: str, b: str) -> bool:
    """The same text but for the order of items within lines (a table row's cells, a list of
    versions, a dict's items): the words of each, punctuation aside, as a multiset."""

    def words(text: str) -> list[str]:
        return sorted(text.translate(str.maketrans(",;.{}", "     ")).split())

    return words(a) == words(b)


def test_a_report_only_run_rewrites_the_markdown_from_the_json(tmp_path: Path) -> None:
    module = importlib.import_module("benchmarks.decode.kernel_ceiling")
    for suffix in (".json", ".md"):
        (tmp_path / f"kernel_ceiling{suffix}").write_bytes(
            (RESULTS / f"kernel_ceiling{suffix}").read_bytes()
        )
    (tmp_path / "kernel_ceiling.md").write_text("stale\n")
    assert module.main(["--report-only", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "kernel_ceiling.md").read_text() == (
        RESULTS / "kernel_ceiling.md"
    ).read_text()
