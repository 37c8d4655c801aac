"""evaluate.speculative: the mean accepted length of the recipe's speculative decoding, measured
through the runtime's Generator in the evaluate stage, reported in eval/ and the manifest,
gated before packaging, and keyed on what it measures."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_speculative_build import DRAFT_SHAPE, EXACT, cached, draft_recipe

from ingot.artifacts import read_manifest, verify_artifact
from ingot.cli import main
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.evaluate import EvalDataError, EvalGateError, speculative_prompts
from ingot.pipeline.evaluate.speculative import measure_speculation
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.stages.engine import EngineOutput
from ingot.pipeline.stages.export import ExportOutput
from ingot.runtime.loader import DrafterFiles

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4}
# Small and fast: 4 prompts of 16 tokens, 16 generated tokens each.
SMALL = {"prompts": 4, "prompt_tokens": 16, "max_tokens": 16}
REPORT_KEYS = {
    "method",
    "num_speculative_tokens",
    "engine_name",
    "engine_matmul_accuracy_level",
    "dataset",
    "dataset_sha256",
    "prompts",
    "prompt_tokens",
    "max_tokens",
    "batching",
    "tokens",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "mean_accepted_length",
    "acceptance_rate",
    "accepted_per_position",
    "target_calls",
    "plain_target_calls",
    "greedy_match",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The target, a smaller draft with its tokenizer, and a directory with eval.txt."""
    root = tmp_path_factory.mktemp("spec-eval")
    target = make_checkpoint(root / "target", "llama")
    draft = make_checkpoint(root / "draft", "llama", seed=1, **DRAFT_SHAPE)
    shutil.copyfile(REPO / "recipes" / "demo" / "pydoc-heldin.txt", root / "eval.txt")
    return target, draft, root


def _ngram_recipe(path: Path, target: Path, **speculative_eval) -> Path:
    """ngram, measured on evaluate.perplexity's text (no dataset of its own)."""
    perplexity = {"dataset": "eval.txt", "seq_len": 32, "max_windows": 2}
    evaluate = {"perplexity": perplexity, "speculative": {**SMALL, **speculative_eval}}
    return write_recipe(path, target, targets=EXACT, speculative=NGRAM, evaluate=evaluate)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_ngram_report_gate_and_cache(models):
    target, _, root = models
    cache = StageCache(root / "cache-ngram")
    first = build(_ngram_recipe(root / "a.yaml", target), root / "out", cache=cache)

    report = json.loads((first.artifact / "eval" / "report.json").read_text())
    assert set(report) == {"perplexity", "speculative"}
    spec = report["speculative"]
    assert set(spec) == REPORT_KEYS | {"prompt_lookup_min", "prompt_lookup_max"}
    assert (spec["method"], spec["num_speculative_tokens"], spec["dataset"]) == (
        "ngram",
        4,
        "eval.txt",  # evaluate.perplexity's, which it defaults to
    )
    assert spec["dataset_sha256"] == report["perplexity"]["dataset_sha256"]
    assert (spec["prompts"], spec["tokens"]) == (4, 4 * 16)
    assert 1.0 <= spec["mean_accepted_length"] <= 5.0
    drafts, accepted = spec["drafts"], spec["accepted_tokens"]
    assert drafts > 0  # generated text repeats itself: prompt lookup finds n-grams
    assert spec["mean_accepted_length"] == pytest.approx(1 + accepted / drafts, abs=1e-6)
    assert spec["acceptance_rate"] == pytest.approx(accepted / spec["draft_tokens"], abs=1e-6)
    assert len(spec["accepted_per_position"]) == 4
    assert sum(spec["accepted_per_position"]) == pytest.approx(accepted / drafts, abs=1e-5)
    # One call per token without speculation (a prefill, then decodes); fewer with it.
    assert spec["plain_target_calls"] == 4 * 16
    assert spec["target_calls"] == spec["plain_target_calls"] - accepted
    assert 0 <= spec["greedy_match"] <= 4  # reported, not judged
    # Counts only, no clock (back-off and adaptive drafting off): measured again, the same.
    stages = {s.stage: s.key for s in first.stages}
    export = ExportOutput(cache.path("export", stages["export"]), "")
    engine = EngineOutput(cache.path("engine", stages["engine:onnxruntime-cpu"]), "").files(export)
    again = measure_speculation(
        speculative_prompts(load_recipe(root / "a.yaml"), root / "a.yaml", target),
        engine,
        DrafterFiles(),  # prompt lookup drafts from the prompt alone
        target / "tokenizer.json",
        max_seq_len=128,
        sliding_window=None,
        vocab_size=320,
    )
    assert again == spec
    markdown = (first.artifact / "eval" / "report.md").read_text()
    assert "## Speculative decoding" in markdown and "| model | perplexity |" in markdown
    summary = verify_artifact(first.artifact).eval["speculative"]
    assert summary["mean_accepted_length"] == spec["mean_accepted_length"]
    assert summary["min_accepted_length"] is None and summary["method"] == "ngram"

    # Only evaluate.speculative changed: evaluate runs again, no engine stage does.
    fewer = build(_ngram_recipe(root / "b.yaml", target, prompts=3), root / "out-b", cache=cache)
    assert cached(fewer) == {
        "quantize": True,
        "export": True,
        "engine:onnxruntime-cpu": True,
        "evaluate": False,
    }
    assert (
        json.loads((fewer.artifact / "eval" / "report.json").read_text())["speculative"]["prompts"]
        == 3
    )

    # A threshold it cannot reach (k = 4: every draft of every step accepted, the last steps'
    # shorter drafts included): the build fails naming the field and both numbers, after
    # re-judging the cached measurement and before packaging; the artifact stays as it was.
    before = _files(first.artifact)
    strict = _ngram_recipe(root / "c.yaml", target, min_accepted_length=5.0)
    events: list[tuple[str, str]] = []
    with pytest.raises(EvalGateError) as err:
        build(strict, root / "out", cache=cache, on_stage=lambda s, e: events.append((s, e)))
    message = str(err.value)
    assert message.startswith("evaluate.speculative.min_accepted_length:")
    assert f"{spec['mean_accepted_length']:.4f}" in message and "threshold 5" in message
    assert ("evaluate", "cached") in events and ("package", "start") not in events
    assert _files(first.artifact) == before

    # A threshold it meets packages from the cache, with the gate in the manifest.
    relaxed = _ngram_recipe(root / "d.yaml", target, min_accepted_length=1.0)
    again = build(relaxed, root / "out-d", cache=cache)
    assert all(cached(again).values())
    assert verify_artifact(again.artifact).eval["speculative"]["min_accepted_length"] == 1.0

    # inspect shows the section, with the measured mean; --json holds the whole manifest.
    text = CliRunner().invoke(main, ["inspect", str(first.artifact)]).output
    assert "speculate  ngram, k=4, prompt lookup 1..4; mean accepted length" in text
    dumped = CliRunner().invoke(main, ["inspect", str(first.artifact), "--json"]).stdout
    as_json = json.loads(dumped)
    assert as_json["speculative"]["method"] == "ngram"
    assert as_json["eval"]["speculative"]["mean_accepted_length"] == spec["mean_accepted_length"]


def _draft_eval_recipe(path: Path, target: Path, draft: Path, **overrides) -> Path:
    """draft_model with k = 3, measured on its own dataset (no perplexity)."""
    evaluate = {"speculative": {"dataset": "eval.txt", **SMALL}}
    return draft_recipe(path, target, draft, evaluate=evaluate, **overrides)


def test_draft_model_is_measured_with_its_draft_engine(models):
    target, draft, root = models
    cache = StageCache(root / "cache-draft")
    result = build(_draft_eval_recipe(root / "e.yaml", target, draft), root / "out-e", cache=cache)
    report = json.loads((result.artifact / "eval" / "report.json").read_text())
    assert set(report) == {"speculative"}  # no perplexity asked for: none measured
    spec = report["speculative"]
    assert set(spec) == REPORT_KEYS
    assert (spec["method"], spec["num_speculative_tokens"]) == ("draft_model", 3)
    assert spec["drafts"] > 0 and spec["mean_accepted_length"] >= 1.0
    assert len(spec["accepted_per_position"]) == 3
    assert read_manifest(result.artifact).eval["speculative"]["method"] == "draft_model"
    text = CliRunner().invoke(main, ["inspect", str(result.artifact)]).output
    assert "speculate  draft_model, k=3" in text
    assert "draft      llama: 1 layers, hidden 32" in text
    assert "draft eng  onnxruntime-cpu: draft/engines/onnxruntime-cpu/model.onnx" in text

    # The draft engine's digest is in the evaluate stage's key: a new draft is measured again.
    float_draft = _draft_eval_recipe(root / "f.yaml", target, draft, draft_fields={"quantize": []})
    second = build(float_draft, root / "out-f", cache=cache)
    runs = cached(second)
    assert runs["engine:onnxruntime-cpu"] and not runs["draft-engine:onnxruntime-cpu"]
    assert not runs["evaluate"]

    # The target drafting for itself (same weights, an exact engine) is accepted throughout.
    own = build(_draft_eval_recipe(root / "g.yaml", target, target), root / "out-g", cache=cache)
    spec = json.loads((own.artifact / "eval" / "report.json").read_text())["speculative"]
    assert spec["acceptance_rate"] >= 0.9 and spec["mean_accepted_length"] > 3.0


def test_too_little_text_fails_before_any_stage(models, tmp_path):
    target, _, root = models
    (tmp_path / "eval.txt").write_text("def add(a, b):\n    return a + b\n")
    evaluate = {"speculative": {"dataset": "eval.txt", **SMALL}}
    recipe = write_recipe(
        tmp_path / "r.yaml", target, targets=EXACT, speculative=NGRAM, evaluate=evaluate
    )
    cache = StageCache(tmp_path / "cache")
    with pytest.raises(EvalDataError, match=r"^evaluate\.speculative\.dataset: .* fewer than"):
        build(recipe, tmp_path / "out", cache=cache)
    (tmp_path / "eval.txt").unlink()
    with pytest.raises(EvalDataError, match=r"^evaluate\.speculative\.dataset: no such file"):
        build(recipe, tmp_path / "out", cache=cache)
    assert not (cache.root / "stages").exists()


# -- the recipe section -----------------------------------------------------------------------

BASE = """\
source: {path: ./ckpt}
artifact: {name: tiny}
export: {max_seq_len: 128}
"""
WITH_NGRAM = BASE + "speculative: {method: ngram, num_speculative_tokens: 4}\n"


def _load(tmp_path: Path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    return load_recipe(path)


def test_defaults_and_the_perplexity_dataset(tmp_path):
    recipe = _load(
        tmp_path,
        WITH_NGRAM + "evaluate: {perplexity: {dataset: e.txt}, speculative: {}}\n",
    )
    spec = recipe.evaluate.speculative
    assert (spec.dataset, spec.prompts, spec.prompt_tokens, spec.max_tokens) == (None, 16, 64, 64)
    assert spec.min_accepted_length is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(
            BASE + "evaluate: {speculative: {dataset: e.txt}}\n",
            "evaluate.speculative: needs a `speculative` section",
            id="no-speculative-section",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {prompts: 4}}\n",
            "evaluate.speculative.dataset: required field missing (there is no "
            "evaluate.perplexity dataset",
            id="no-dataset",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {perplexity: {dataset: e.txt}, speculative: {split: test}}\n",
            "evaluate.speculative.split: only with evaluate.speculative.dataset",
            id="split-without-dataset",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {dataset: e.txt, max_tokens: 100}}\n",
            "evaluate.speculative: prompt_tokens + max_tokens = 164 exceeds export.max_seq_len 128",
            id="too-long",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {dataset: e.txt, min_accepted_length: 5.5}}\n",
            "evaluate.speculative.min_accepted_length: 5.5 can never be met (at most "
            "num_speculative_tokens + 1 = 5",
            id="unreachable-gate",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {dataset: e.txt, min_accepted_length: 0.5}}\n",
            "evaluate.speculative.min_accepted_length: Input should be greater than or equal to 1",
            id="gate-below-one",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {dataset: e.txt, prompts: '4'}}\n",
            "evaluate.speculative.prompts: Input should be a valid integer (got '4')",
            id="strict-int",
        ),
        pytest.param(
            WITH_NGRAM + "evaluate: {speculative: {dataset: e.txt, prompt: 4}}\n",
            "evaluate.speculative.prompt: unknown field",
            id="unknown-field",
        ),
    ],
)
def test_bad_sections_name_the_field(tmp_path, text, fragment):
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, text)
    assert any(fragment in line for line in err.value.problems), err.value
