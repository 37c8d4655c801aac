"""`ingot plan` of a draft_model recipe: the draft's stages, estimated from its own config.json
with the target's formulas, and what it adds to the disk."""

from __future__ import annotations

import json
from pathlib import Path

from ingot.pipeline.plan import plan_build
from ingot.pipeline.recipe import load_recipe

from fixtures import BASE, write_recipe

DRAFT = {**BASE, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}


def checkpoint_config(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return path


def test_plan_lists_the_draft_stages(tmp_path):
    target = checkpoint_config(tmp_path / "target", BASE)
    draft = checkpoint_config(tmp_path / "draft", DRAFT)
    plain = write_recipe(tmp_path / "a.yaml", target)
    spec = {"method": "draft_model", "num_speculative_tokens": 4}
    drafted = write_recipe(
        tmp_path / "b.yaml", target, speculative={**spec, "draft": {"source": {"path": str(draft)}}}
    )
    config = json.loads((target / "config.json").read_text())
    without = plan_build(load_recipe(plain), plain, config, target)
    with_draft = plan_build(load_recipe(drafted), drafted, config, target)
    stages = [s.stage for s in with_draft.stages]
    assert stages == [
        "source",
        "quantize",
        "export",
        "engine:onnxruntime-cpu",
        "draft-source",
        "draft-quantize",
        "draft-export",
        "draft-engine:onnxruntime-cpu",
        "package",
    ]
    by_name = {s.stage: s for s in with_draft.stages}
    engine = by_name["engine:onnxruntime-cpu"]
    draft_engine = by_name["draft-engine:onnxruntime-cpu"]
    assert draft_engine.peak_bytes > 0 and draft_engine.seconds < engine.seconds
    assert with_draft.model["draft"]["layers"] == 1
    assert with_draft.model["draft"]["params"] < with_draft.model["params"]
    for what in ("stage_cache", "artifact"):
        assert with_draft.disk[what] > without.disk[what]
