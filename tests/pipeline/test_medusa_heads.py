"""Medusa heads: vLLM's checkpoint layout read and written, the ONNX graph against the torch
heads, the target's hidden states against the model's own forward, and self-distillation that
learns, resumes bit for bit, and refuses what it cannot start from."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from ingot.pipeline.heads import train as train_module
from ingot.pipeline.heads.export import MODEL_FILE, check_heads, export_heads
from ingot.pipeline.heads.train import final_hidden, train_heads
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.llama import LlamaModel
from ingot.pipeline.model.medusa import (
    MedusaConfig,
    MedusaError,
    MedusaHeadsModel,
    load_medusa,
    save_medusa,
)
from ingot.pipeline.recipe import MedusaTrain

from fixtures import model_config

CFG = MedusaConfig(num_heads=3, num_layers=2, hidden_size=64, vocab_size=320)


def _random_heads(cfg: MedusaConfig = CFG, seed: int = 0) -> MedusaHeadsModel:
    torch.manual_seed(seed)
    heads = MedusaHeadsModel(cfg)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    return heads.eval()


def _assert_same(a: MedusaHeadsModel, b: MedusaHeadsModel) -> None:
    theirs = b.state_dict()
    assert list(theirs) == list(a.state_dict())
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_vllm_layout_round_trip(tmp_path):
    heads = _random_heads()
    save_medusa(heads, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["num_heads"] == 3
    assert config["num_hidden_layers"] == 2 and config["medusa_fc_bias"] is True
    loaded = load_medusa(tmp_path)
    _assert_same(heads, loaded)
    assert "blocks.1.layers.1.weight" in heads.state_dict()
    assert list(heads.state_dict()["lm_heads.2.weight"].shape) == [320, 64]


def _write(path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))


def _vllm_config(**overrides) -> dict:
    return {"model_type": "medusa", "hidden_size": 8, "vocab_size": 16, "num_heads": 2,
            "num_hidden_layers": 1, **overrides}  # fmt: skip


def test_vllm_variants_no_bias_shared_lm_head_and_prefix(tmp_path):
    w, lm = torch.randn(8, 8), torch.randn(16, 8)
    tensors = {
        "medusa_heads.blocks.0.layers.0.weight": w,
        "medusa_heads.blocks.1.layers.0.weight": 2 * w,
        "medusa_heads.lm_heads.0.weight": lm,
    }
    _write(tmp_path / "m", _vllm_config(original_lm_head=True), tensors)
    heads = load_medusa(tmp_path / "m")
    assert heads.blocks[0].layers[0].bias is None  # vLLM's default: no medusa_fc_bias
    assert torch.equal(heads.lm_heads[1].weight, lm)  # the one lm_head, shared
    assert torch.equal(heads.blocks[1].layers[0].weight, 2 * w)


@pytest.mark.parametrize(
    "config, tensors, message",
    [
        ({}, {"blocks.0.layers.0.weight": torch.randn(8, 8)}, "missing tensors"),
        (
            {},
            {
                "blocks.0.layers.0.weight": torch.randn(8, 8),
                "blocks.1.layers.0.weight": torch.randn(8, 8),
                "lm_heads.0.weight": torch.randn(16, 8),
                "lm_heads.1.weight": torch.randn(15, 8),
            },
            "lm_heads.1.weight \\[15, 8\\] \\(expected \\[16, 8\\]\\)",
        ),
        ({"truncated_vocab_size": 8}, {}, "truncated vocabulary"),
        ({"num_heads": 0}, {}, "num_heads must be a positive integer"),
    ],
)
def test_a_checkpoint_vllm_would_not_serve_is_refused(tmp_path, config, tensors, message):
    _write(tmp_path / "m", _vllm_config(**config), tensors or {"x": torch.zeros(1)})
    with pytest.raises(MedusaError, match=message):
        load_medusa(tmp_path / "m")


def test_graph_proposes_the_heads_greedy_tokens(tmp_path):
    heads = _random_heads()
    export_heads(heads, tmp_path)
    hidden = torch.randn(40, CFG.hidden_size, generator=torch.Generator().manual_seed(1))
    report = check_heads(heads, tmp_path / MODEL_FILE, hidden)
    assert report["rows"] == 40 and report["heads"] == 3 and report["mismatches"] == 0
    # A graph of other heads fails the check.
    export_heads(_random_heads(seed=1), tmp_path / "other")
    with pytest.raises(ValueError, match="disagree"):
        check_heads(heads, tmp_path / "other" / MODEL_FILE, hidden)


def _target() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(model_config()).eval()


def test_final_hidden_is_the_models_own(tmp_path):
    model = _target()
    windows = torch.randint(2, 320, (5, 24), generator=torch.Generator().manual_seed(0))
    hidden = final_hidden(ModelLayers(model), windows)  # [5, 24, 64]
    with torch.no_grad():
        want = model(windows)[1]  # [5, 24, 64], after the final norm
    torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-5)


SPEC = MedusaTrain(num_heads=2, num_layers=1, steps=250, learning_rate=3e-3, batch_size=32)


def _features():
    model = _target()
    # A corpus with structure to learn: a few short token cycles, repeated.
    rng = torch.Generator().manual_seed(0)
    cycles = [torch.randint(2, 320, (n,), generator=rng) for n in (3, 4, 5)]
    windows = torch.stack([cycles[i % 3].repeat(40)[:48] for i in range(24)])
    return final_hidden(ModelLayers(model), windows), model.lm_head


def test_training_learns_the_targets_future(tmp_path):
    hidden, lm_head = _features()
    heads, report = train_heads(hidden, lm_head, SPEC, tmp_path)
    assert report["loss_last"] < 0.5 * report["loss_first"]
    # Head 0 started as the target's lm_head (proposing the next token again); it now
    # proposes the token after, as the target would: on held-out windows it mostly agrees.
    assert report["held_out_agreement"][0] > 0.8
    assert len(report["held_out_agreement"]) == 2


def test_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    hidden, lm_head = _features()
    (tmp_path / "whole").mkdir()
    whole, _ = train_heads(hidden, lm_head, SPEC, tmp_path / "whole")
    real, calls = train_module._distillation_loss, []

    def crash_at_150(*args):
        calls.append(1)
        if len(calls) == 150:
            raise KeyboardInterrupt  # the build killed mid-training
        return real(*args)

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(train_module, "_distillation_loss", crash_at_150)
    with pytest.raises(KeyboardInterrupt):
        train_heads(hidden, lm_head, SPEC, work)
    monkeypatch.setattr(train_module, "_distillation_loss", real)
    assert (work / train_module._CHECKPOINT).exists()  # step 100's
    resumed, report = train_heads(hidden, lm_head, SPEC, work)
    _assert_same(whole, resumed)
    assert report["steps"] == SPEC.steps


def test_training_needs_windows_longer_than_the_heads(tmp_path):
    hidden, lm_head = _features()
    with pytest.raises(ValueError, match="too short for 2 Medusa heads"):
        train_heads(hidden[:, :3], lm_head, SPEC, tmp_path)
