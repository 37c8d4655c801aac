"""EAGLE-3 self-distillation: the target's features against its own residual stream, the
training-time test's masks against chained drafting with a KV cache, training that learns the
target's greedy continuation, resumes bit for bit, and refuses spans it cannot draw."""

from __future__ import annotations

import pytest
import torch

from ingot.pipeline.heads import eagle_train as train_module
from ingot.pipeline.heads.eagle_train import draft_acceptance, target_features, train_eagle
from ingot.pipeline.model.eagle3 import Eagle3Draft
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.llama import LlamaModel, causal_mask
from ingot.pipeline.model.rope import cos_sin
from ingot.pipeline.recipe import EagleTrain

from fixtures import model_config

V = 96
AUX = (2, 0, 3)  # out of order, with the embedding's output (layer 0's input)
SPEC = EagleTrain(steps=150, learning_rate=3e-3, batch_size=16, span=16, ttt_steps=3)


def _target() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(model_config(vocab_size=V, num_hidden_layers=4)).eval()


def test_features_are_the_targets_residual_stream():
    model = _target()
    windows = torch.randint(2, V, (5, 12), generator=torch.Generator().manual_seed(0))
    features, final = target_features(ModelLayers(model), windows, AUX)  # [5, 12, 3 * 64]
    positions = torch.arange(12)[None]
    cos, sin = cos_sin(model.cfg, positions)
    mask = causal_mask(positions, positions)
    entering = []  # the residual stream entering each layer, by hand
    with torch.no_grad():
        x = model.embed_tokens(windows)
        for layer in model.layers:
            entering.append(x)
            x = layer(x, cos, sin, mask)[0]
        want_final = model(windows)[1]
    want = torch.cat([entering[i] for i in AUX], dim=-1)
    torch.testing.assert_close(features, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, want_final, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="aux_layers \\[0, 1, 4\\]: \\[4\\] not in \\[0, 3\\]"):
        target_features(ModelLayers(model), windows, (0, 1, 4))


def test_unrolled_steps_are_chained_drafting_with_a_cache():
    """Each chain of the training-time test (greedy, as in the acceptance) is what the runtime
    drafts: prefill positions < n-1 from true features, then one position per call."""
    model = _target()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, V, (1, 12), generator=g)
    features = torch.randn(1, 11, 3 * 64, generator=g)
    draft = Eagle3Draft.for_target(
        model.cfg, AUX, model.lm_head.weight, model.embed_tokens.weight.detach(), seed=0
    )
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.1, generator=g)
        positions = torch.arange(11)[None]
        unrolled = train_module._unroll(
            draft, draft.combine(features), tokens[:, 1:], positions, 4, 12, greedy=True
        )
        s = 5  # the chain from position n - 1 = 5 (tok[6] the last sampled token)
        cos, sin = cos_sin(draft.cfg.layer, positions, seq_len=12)
        prefix = causal_mask(positions[:, :s], positions[:, :s])
        _, _, past = draft(
            tokens[:, 1 : s + 1], draft.combine(features[:, :s]), cos[:, :s], sin[:, :s], prefix
        )
        token, hidden = tokens[:, s + 1 : s + 2], draft.combine(features[:, s : s + 1])
        for j in range(4):
            at = slice(s + j, s + j + 1)
            sees = torch.ones(1, 1, 1, s + j + 1, dtype=torch.bool)
            logits, hidden, past = draft(token, hidden, cos[:, at], sin[:, at], sees, past)
            token = logits.argmax(-1)
            assert token.item() == unrolled[j][0, s + j].argmax().item()
            torch.testing.assert_close(logits[0, 0], unrolled[j][0, s + j], rtol=1e-4, atol=1e-4)


def _corpus(model: LlamaModel, count: int = 24, length: int = 32) -> torch.Tensor:
    """The target's own greedy continuations of short random prompts: where its drafts are
    accepted, the text is what the target would say."""
    g = torch.Generator().manual_seed(2)
    windows = []
    for _ in range(count):
        prompt = torch.randint(2, V, (3,), generator=g).tolist()
        windows.append(prompt + model.generate_greedy(prompt, length - 3, stop_at_eos=False))
    return torch.tensor(windows)


@pytest.fixture(scope="module")
def data():
    """(features, final, windows, target) over the target's own text, built once."""
    model = _target()
    windows = _corpus(model)
    features, final = target_features(ModelLayers(model), windows, AUX)
    return features, final, windows, model


def _train(features, final, windows, model, work_dir, spec=SPEC):
    embedding = model.embed_tokens.weight.detach()
    return train_eagle(
        features, final, windows, model.lm_head, embedding, model.cfg, AUX, spec, work_dir
    )


def test_training_learns_to_draft_the_targets_tokens(tmp_path, data):
    features, final, windows, model = data
    draft, report = _train(features, final, windows, model, tmp_path)
    assert report["loss_last"] < 0.5 * report["loss_first"]
    assert report["windows"] == {"train": 22, "held_out": 2}
    untrained = Eagle3Draft.for_target(
        model.cfg, AUX, model.lm_head.weight, model.embed_tokens.weight.detach(), SPEC.seed
    ).eval()
    before = draft_acceptance(
        untrained, model.lm_head, features[22:], final[22:], windows[22:], 3, SPEC.span
    )
    after = report["held_out_acceptance"]
    assert len(after) == 3 and after == sorted(after, reverse=True)
    assert after[0] > before[0] + 0.3 and after[2] > before[2]
    assert report["mean_accepted_length"] == pytest.approx(1 + sum(after))


def test_training_resumes_to_the_same_weights(tmp_path, monkeypatch, data):
    features, final, windows, model = data
    monkeypatch.setattr(train_module, "CHECKPOINT_EVERY", 20)
    spec = SPEC.model_copy(update={"steps": 50})
    (tmp_path / "whole").mkdir()
    whole, _ = _train(features, final, windows, model, tmp_path / "whole", spec)
    real, calls = train_module._ttt_loss, []

    def crash_at_45(*args):
        calls.append(1)
        if len(calls) == 45:
            raise KeyboardInterrupt  # the build killed mid-training
        return real(*args)

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(train_module, "_ttt_loss", crash_at_45)
    with pytest.raises(KeyboardInterrupt):
        _train(features, final, windows, model, work, spec)
    monkeypatch.setattr(train_module, "_ttt_loss", real)
    assert (work / train_module.CHECKPOINT_NAME).exists()  # step 40's
    resumed, report = _train(features, final, windows, model, work, spec)
    theirs = resumed.state_dict()
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    assert report["steps"] == 50 and len(report["loss_curve"]) == 1


def test_spans_must_fit_the_windows(tmp_path, data):
    features, final, windows, model = data
    with pytest.raises(ValueError, match="span 16 exceeds calibration.seq_len 12"):
        _train(features[:, :12], final[:, :12], windows[:, :12], model, tmp_path)
    with pytest.raises(ValueError, match="span 8 leaves no position for ttt_steps 8"):
        spec = SPEC.model_copy(update={"span": 8, "ttt_steps": 8})
        _train(features, final, windows, model, tmp_path, spec)
    with pytest.raises(ValueError, match="calibration.samples: 1 window"):
        _train(features[:1], final[:1], windows[:1], model, tmp_path)
