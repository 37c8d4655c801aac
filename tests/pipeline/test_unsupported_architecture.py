"""A checkpoint of an architecture ingot does not take fails before any download or work, with
one line naming the architecture and listing those ingot takes: a local one before its weights
are hashed, a hub one after its config.json alone was fetched (a mocked hub)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingot.cli import main
from ingot.pipeline import source as source_module
from ingot.pipeline.model.family import MODEL_FAMILIES
from ingot.pipeline.source import SourceError, resolve_source

from fixtures import make_checkpoint, write_recipe

GPT_NEOX = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}


@pytest.fixture(scope="module")
def neox(tmp_path_factory) -> Path:
    """A checkpoint whose config.json names an architecture ingot does not take."""
    path = make_checkpoint(tmp_path_factory.mktemp("arch") / "neox")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **GPT_NEOX}))
    return path


def _takes() -> str:
    return ", ".join(f"{MODEL_FAMILIES.get(n).hf_class} ({n})" for n in MODEL_FAMILIES.names())


def test_a_local_checkpoint_fails_before_its_weights_are_read(neox, monkeypatch):
    def read_weights(path):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(source_module, "weight_files", read_weights)
    with pytest.raises(SourceError) as err:
        resolve_source({"path": str(neox)})
    line = str(err.value)
    assert "\n" not in line
    assert line == (
        f"{neox / 'config.json'}: architecture GPTNeoXForCausalLM (model_type 'gpt_neox') is "
        f"not one ingot takes; it takes {_takes()}"
    )
    assert "LlamaForCausalLM (llama)" in line and "Qwen2ForCausalLM (qwen2)" in line


def test_a_hub_checkpoint_fetches_config_json_alone_then_fails(neox, monkeypatch):
    fetched = []

    class FakeApi:
        def model_info(self, repo_id, revision):
            return types.SimpleNamespace(sha="b" * 40)

    def fake_file(repo_id, filename, revision):
        fetched.append(filename)
        return str(neox / filename)

    def fake_snapshot(*args, **kwargs):
        raise AssertionError("the checkpoint was downloaded")

    fake = types.SimpleNamespace(
        HfApi=FakeApi, hf_hub_download=fake_file, snapshot_download=fake_snapshot
    )
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    with pytest.raises(SourceError, match="architecture GPTNeoXForCausalLM") as err:
        resolve_source({"hub": "org/neox", "revision": "main"})
    assert fetched == ["config.json"]
    assert str(err.value).startswith(f"org/neox@{'b' * 12}: config.json: architecture")
    assert str(err.value).endswith(_takes())


def test_no_architectures_key_names_the_model_type(neox, tmp_path):
    copy = shutil.copytree(neox, tmp_path / "m")
    config = json.loads((copy / "config.json").read_text())
    del config["architectures"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match=r"architecture model_type 'gpt_neox' is not one"):
        resolve_source({"path": str(copy)})


def test_ingot_build_prints_one_line(neox, tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", neox)
    result = CliRunner().invoke(main, ["build", "--recipe", str(recipe), "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "GPTNeoXForCausalLM" in lines[0]
