"""speculative: the draft model goes through the target's stages into the artifact's draft/,
checked like the target's engine; ngram is a manifest record only; the two models' stages are
cached apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingot.artifacts import read_manifest, verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.stages import quantize as quantize_stage

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
# Half the target's width, one layer: a draft of a different shape with the same tokenizer.
DRAFT_SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
INT8 = {"method": "rtn", "bits": 8, "group_size": -1, "ignore": ["lm_head"]}
# fp32 activations: one check per engine (level 4 adds an exact check first), a faster suite.
EXACT = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("speculative")
    target = make_checkpoint(root / "target", "llama")
    draft = make_checkpoint(root / "draft", "llama", seed=1, **DRAFT_SHAPE)
    return target, draft


@pytest.fixture(scope="module")
def shared(tmp_path_factory, checkpoints) -> tuple[StageCache, object]:
    """One draft_model build (the draft inherits the target's quantize) and its cache, which
    the tests below extend with variants: each builds only the stages it changes."""
    root = tmp_path_factory.mktemp("shared")
    cache = StageCache(root / "cache")
    target, draft = checkpoints
    return cache, build(draft_recipe(root / "r.yaml", target, draft), root / "out", cache=cache)


def draft_recipe(path: Path, target: Path, draft: Path, draft_fields=None, **overrides) -> Path:
    speculative = {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "draft": {"source": {"path": str(draft)}, **(draft_fields or {})},
    }
    return write_recipe(path, target, speculative=speculative, **{"targets": EXACT, **overrides})


def cached(result) -> dict[str, bool]:
    return {s.stage: s.cached for s in result.stages if s.stage != "package"}


def test_draft_model_is_built_into_draft_engines(shared, checkpoints):
    import onnxruntime as ort

    from ingot.pipeline.engines.onnxruntime import OrtGraph, load_onnxruntime_engine
    from ingot.pipeline.export.check import check_graph
    from ingot.pipeline.quantize.ir_layers import IRLayers

    cache, result = shared
    assert not any(cached(result).values())
    verify_artifact(result.artifact)
    manifest = read_manifest(result.artifact)
    spec = manifest.speculative
    assert (spec.method, spec.num_speculative_tokens) == ("draft_model", 3)
    drafted = spec.draft
    assert [e.name for e in drafted.engines] == [e.name for e in manifest.engines]
    assert drafted.engines[0].path == "draft/engines/onnxruntime-cpu/model.onnx"
    assert drafted.graph.path == drafted.engines[0].path
    assert (drafted.model.hidden_size, drafted.model.num_layers) == (32, 1)
    assert drafted.model.max_seq_len == manifest.model.max_seq_len == 128
    assert drafted.graph.kv_block_size == manifest.graph.kv_block_size == 8
    # Engines only: no portable graph of the draft; the target's layout is unchanged.
    files = {f.path for f in manifest.files}
    assert {p for p in files if p.startswith("draft/")} == {
        "draft/engines/onnxruntime-cpu/model.onnx",
        "draft/engines/onnxruntime-cpu/model.onnx.data",
    }
    assert "engines/onnxruntime-cpu/model.onnx" in files and "model.onnx" not in files
    assert manifest.recipe["speculative"]["draft"]["source"]["path"] == str(checkpoints[1])

    # The draft's engine stage ran the target's check, and the shipped engine agrees with the
    # draft's own IR through the same check.
    check = drafted.engines[0].build["check"]
    assert check["accuracy"] == "exact" and check["greedy_match"]
    stages = {s.stage: s for s in result.stages}
    ir_dir = cache.path("draft-quantize", stages["draft-quantize"].key)
    engine = drafted.engines[0]
    session = load_onnxruntime_engine(result.artifact / engine.path, engine.session_options)
    report = check_graph(IRLayers(ir_dir), OrtGraph(session), accuracy="exact")
    assert report["greedy_match"]
    names = [i.name for i in ort.InferenceSession(str(result.artifact / engine.path)).get_inputs()]
    assert names == [t.name for t in drafted.graph.inputs]

    lock = json.loads((result.artifact / "ingot.lock").read_text())
    assert {"draft-quantize", "draft-export", "draft-engine:onnxruntime-cpu"} <= set(lock["stages"])
    assert "model.safetensors" in lock["draft"]["source"]["files"]


def test_draft_engine_that_disagrees_with_its_ir_fails_the_build(
    tmp_path, checkpoints, shared, monkeypatch
):
    import torch

    from ingot.pipeline.export import ExportError
    from ingot.pipeline.quantize.ir_layers import IRLayers
    from ingot.pipeline.stages import engine as engine_stage

    class DraftDisagrees(IRLayers):  # the draft's IR only (hidden 32): the target's passes
        def layer(self, i):
            layer = super().layer(i)
            if self.cfg.hidden_size == 32:
                with torch.no_grad():
                    layer.attn_norm.weight.mul_(3.0)
            return layer

    monkeypatch.setattr(engine_stage, "IRLayers", DraftDisagrees)
    target, draft = checkpoints
    cache, _ = shared
    engines = cache.root / "stages" / "draft-engine"
    before = sorted(engines.iterdir())
    float_draft = draft_recipe(tmp_path / "r.yaml", target, draft, {"quantize": []})  # a new key
    with pytest.raises(ExportError, match="disagrees with the IR"):
        build(float_draft, tmp_path / "out", cache=cache)
    assert sorted(engines.iterdir()) == before  # nothing cached, no temp dir left
    assert not (tmp_path / "out").exists()


def test_ngram_is_recorded_and_changes_no_stage(tmp_path, checkpoints):
    target, _ = checkpoints
    cache = StageCache(tmp_path / "cache")
    plain_recipe = write_recipe(tmp_path / "a.yaml", target, targets=EXACT)
    plain = build(plain_recipe, tmp_path / "a", cache=cache)
    assert read_manifest(plain.artifact).speculative is None
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 3,
    }
    recipe = write_recipe(tmp_path / "b.yaml", target, targets=EXACT, speculative=ngram)
    result = build(recipe, tmp_path / "b", cache=cache)
    assert all(cached(result).values()) and set(cached(result)) == set(cached(plain))
    manifest = read_manifest(result.artifact)
    assert manifest.speculative.model_dump() == {
        **ngram,
        "draft": None,
        "heads": None,
        "eagle": None,
    }
    assert not (result.artifact / "draft").exists()


def test_changing_one_model_reuses_the_other_models_stages(tmp_path, checkpoints, shared):
    target, draft = checkpoints
    cache, _ = shared
    # The draft's own quantize list: only its stages run again.
    own = draft_recipe(tmp_path / "b.yaml", target, draft, {"quantize": [INT8]})
    second = build(own, tmp_path / "b", cache=cache)
    assert cached(second) == {
        "quantize": True,
        "export": True,
        "engine:onnxruntime-cpu": True,
        "draft-quantize": False,
        "draft-export": False,
        "draft-engine:onnxruntime-cpu": False,
    }
    # The target's quantize changed, the draft keeps its own list: only the target's run.
    target_int8 = draft_recipe(
        tmp_path / "c.yaml", target, draft, {"quantize": [INT8]}, quantize=[INT8]
    )
    third = build(target_int8, tmp_path / "c", cache=cache)
    assert {stage: hit for stage, hit in cached(third).items()} == {
        "quantize": False,
        "export": False,
        "engine:onnxruntime-cpu": False,
        "draft-quantize": True,
        "draft-export": True,
        "draft-engine:onnxruntime-cpu": True,
    }


def test_calibrated_draft_gets_its_own_calibrate_stage(tmp_path, checkpoints):
    target, draft = checkpoints
    gptq = {"method": "gptq", "bits": 4, "group_size": 32, "ignore": ["lm_head"]}
    calibration = {
        "dataset": str(REPO / "recipes" / "demo" / "pydoc-heldin.txt"),
        "samples": 4,
        "seq_len": 32,
        "device": "cpu",
    }
    recipe = draft_recipe(
        tmp_path / "r.yaml", target, draft, {"quantize": [gptq]}, calibration=calibration
    )
    result = build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    stages = [s.stage for s in result.stages]
    assert "calibrate" not in stages  # the target is RTN
    assert stages.index("draft-calibrate") < stages.index("draft-quantize")
    drafted = read_manifest(result.artifact).speculative.draft
    assert drafted.model.quantization[0]["method"] == "gptq"
    lock = json.loads((result.artifact / "ingot.lock").read_text())
    assert lock["draft"]["calibration"]["samples"] == 4 and "calibration" not in lock


# -- checked before any stage runs ---------------------------------------------------------


def _edited_copy(src: Path, dst: Path, config=None, tokenizer=None) -> Path:
    """A copy of checkpoint `src` with config.json / tokenizer.json edited in place."""
    import shutil

    shutil.copytree(src, dst)
    for name, edit in (("config.json", config), ("tokenizer.json", tokenizer)):
        if edit is not None:
            data = json.loads((dst / name).read_text())
            edit(data)
            (dst / name).write_text(json.dumps(data))
    return dst


def _swap_two_tokens(tokenizer: dict) -> None:
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _extra_special_token(tokenizer: dict) -> None:
    tokenizer["added_tokens"].append(
        {
            "id": 319,
            "content": "<|tool|>",
            "special": True,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
        }  # fmt: skip
    )


@pytest.mark.parametrize(
    ("edits", "fragments"),
    [
        pytest.param(
            {"tokenizer": _swap_two_tokens},
            ["speculative.draft.source: tokenizer.json differs", "model vocabulary: 2 token(s)"],
            id="tokenizer-ids",
        ),
        pytest.param(
            {"tokenizer": _extra_special_token},
            ["speculative.draft.source: tokenizer.json", "added tokens: 1 only in the draft's"],
            id="added-token",
        ),
        pytest.param(
            {"config": lambda c: c.update(vocab_size=384)},
            ["speculative.draft.source: vocab_size 384", "the target's 320"],
            id="vocab-size",
        ),
        pytest.param(
            {"config": lambda c: c.update(max_position_embeddings=64)},
            ["speculative.draft.source: max_position_embeddings 64", "export.max_seq_len 128"],
            id="max-position-embeddings",
        ),
    ],
)
def test_draft_that_cannot_serve_the_target_fails_before_any_stage(
    tmp_path, checkpoints, edits, fragments
):
    from ingot.pipeline.recipe import RecipeError

    target, draft = checkpoints
    bad = _edited_copy(draft, tmp_path / "draft", **edits)
    cache = StageCache(tmp_path / "cache")
    with pytest.raises(RecipeError) as err:
        build(draft_recipe(tmp_path / "r.yaml", target, bad), tmp_path / "out", cache=cache)
    assert any(all(f in line for f in fragments) for line in err.value.problems), err.value
    assert not (cache.root / "stages").exists()


def test_a_draft_of_an_architecture_ingot_does_not_take_fails_before_any_stage(
    tmp_path, checkpoints
):
    from ingot.pipeline.source import SourceError

    target, draft = checkpoints
    bad = _edited_copy(draft, tmp_path / "draft", config=lambda c: c.update(model_type="gpt2"))
    cache = StageCache(tmp_path / "cache")
    with pytest.raises(SourceError) as err:
        build(draft_recipe(tmp_path / "r.yaml", target, bad), tmp_path / "out", cache=cache)
    assert str(err.value).startswith(f"speculative.draft.source: {bad / 'config.json'}: ")
    assert "(model_type 'gpt2') is not one ingot takes" in str(err.value)
    assert not (cache.root / "stages").exists()


@pytest.mark.parametrize(
    ("draft_fields", "overrides", "fragment"),
    [
        pytest.param(
            {"quantize": [{"method": "rtn", "bits": 4, "group_size": 64}]},
            {},
            "speculative.draft.quantize.0.group_size: 64 does not divide hidden_size 32",
            id="own-list",
        ),
        pytest.param(
            {},
            {"quantize": [{"method": "rtn", "bits": 4, "group_size": 64}]},
            "speculative.draft (the target's quantize, applied to the draft): "
            "quantize.0.group_size: 64 does not divide hidden_size 32",
            id="inherited-list",
        ),
    ],
)
def test_draft_quantize_is_checked_against_the_draft(
    tmp_path, checkpoints, monkeypatch, draft_fields, overrides, fragment
):
    from ingot.pipeline.recipe import RecipeError

    def no_work(*args, **kwargs):
        raise AssertionError("a stage ran")

    monkeypatch.setattr(quantize_stage, "run_quantize", no_work)
    target, draft = checkpoints
    recipe = draft_recipe(tmp_path / "r.yaml", target, draft, draft_fields, **overrides)
    with pytest.raises(RecipeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))


def test_missing_draft_checkpoint_names_the_field(tmp_path, checkpoints):
    from ingot.pipeline.source import SourceError

    target, _ = checkpoints
    recipe = draft_recipe(tmp_path / "r.yaml", target, tmp_path / "nowhere")
    with pytest.raises(SourceError, match=r"^speculative\.draft\.source\.path: .* not a directory"):
        build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
