"""The EAGLE-3 draft: the speculators layout read and written (a shared or own embedding, a
truncated vocabulary, the `midlayer.` prefix), checkpoints that cannot serve the target
refused naming the file and field, and the forward against the formula written out and
against itself one token at a time."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ingot.pipeline.model.eagle3 import (
    Eagle3Config,
    Eagle3Draft,
    Eagle3Error,
    default_aux_layers,
    load_eagle3,
    load_eagle3_config,
    save_eagle3,
)
from ingot.pipeline.model.llama import causal_mask
from ingot.pipeline.model.rope import cos_sin

from fixtures import model_config

V, H = 100, 64
TARGET = model_config(vocab_size=V, num_hidden_layers=4)  # heads 4, kv heads 2, head_dim 16
EMBEDDING = torch.randn(V, H, generator=torch.Generator().manual_seed(7))  # the target's
LLAMA_TARGET = {"verifier": "tiny-llama", "verifier_class": "LlamaForCausalLM"}


def _config(**overrides) -> Eagle3Config:
    layer = replace(TARGET, num_layers=1, bos_token_id=None, eos_token_ids=())
    cfg = Eagle3Config(
        layer=layer,
        vocab_size=V,
        draft_vocab_size=V,
        target_hidden_size=H,
        norm_before_residual=True,
        aux_layers=(1, 2, 3),
        has_embedding=False,
    )
    return replace(cfg, **overrides)


def _draft(cfg: Eagle3Config | None = None, seed: int = 0) -> Eagle3Draft:
    """A draft with every weight random (norms around 1), sharing EMBEDDING unless it has its
    own."""
    cfg = cfg or _config()
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    if not cfg.has_embedding:
        draft.set_embedding(EMBEDDING)
    return draft.eval()


def _inputs(draft: Eagle3Draft, b: int = 2, t: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    features = torch.randn(b, t, 3 * draft.cfg.target_hidden_size, generator=g)
    positions = torch.arange(3, 3 + t).expand(b, t)
    cos, sin = cos_sin(draft.cfg.layer, positions)
    return ids, draft.combine(features), positions, cos, sin, causal_mask(positions, positions)


def _assert_same(a: Eagle3Draft, b: Eagle3Draft) -> None:
    theirs = b.state_dict()
    assert list(theirs) == list(a.state_dict())
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_default_aux_layers_are_vllms_where_distinct():
    assert default_aux_layers(32) == (2, 16, 29)
    assert default_aux_layers(7) == (2, 3, 4)
    # vLLM's own (1, 2, 3) / (2, 3, 3) would give it two states where fc reads three
    assert default_aux_layers(4) == (1, 2, 3) and default_aux_layers(6) == (1, 3, 5)
    assert default_aux_layers(3) == (0, 1, 2)
    with pytest.raises(Eagle3Error, match="3 distinct layers of the target, which has 2"):
        default_aux_layers(2)


def test_round_trip_with_the_targets_embedding(tmp_path):
    draft = _draft()
    save_eagle3(
        draft,
        tmp_path,
        num_speculative_tokens=3,
        verifier="tiny-qwen2",
        verifier_class="Qwen2ForCausalLM",  # the target's class; the draft layer is Llama's
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == V
    verifier = config["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "tiny-qwen2", "architectures": ["Qwen2ForCausalLM"]}
    assert config["transformer_layer_config"]["architectures"] == ["LlamaForCausalLM"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    names = set(load_file(tmp_path / "model.safetensors"))
    # The embedding is the target's; over the full vocabulary vLLM takes no d2t / t2d.
    assert "embed_tokens.weight" not in names and "d2t" not in names and "t2d" not in names
    assert "layers.0.self_attn.q_proj.weight" in names

    loaded = load_eagle3(tmp_path, EMBEDDING)
    assert loaded.cfg == draft.cfg
    _assert_same(draft, loaded)
    assert torch.equal(loaded.embed_tokens.weight, EMBEDDING)
    ids, hidden, _, cos, sin, mask = _inputs(draft)
    outputs = loaded(ids, hidden, cos, sin, mask), draft(ids, hidden, cos, sin, mask)
    for got, want in zip(*outputs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(Eagle3Error, match="no embed_tokens.weight"):
        load_eagle3(tmp_path)


def test_truncated_vocabulary_and_own_embedding(tmp_path):
    cfg = _config(draft_vocab_size=40, has_embedding=True, target_hidden_size=48)
    draft = _draft(cfg)
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(3))[:40].sort().values
    draft.d2t.copy_(kept - torch.arange(40))  # draft id i is target id kept[i]
    save_eagle3(draft, tmp_path, num_speculative_tokens=2, **LLAMA_TARGET)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("t2d").nonzero().flatten().tolist() == kept.tolist()
        assert list(f.get_tensor("fc.weight").shape) == [H, 3 * 48]
    loaded = load_eagle3(tmp_path)  # its own embedding: no target's needed
    _assert_same(draft, loaded)
    assert loaded.cfg.has_embedding and loaded.cfg.target_hidden_size == 48
    draft_ids = torch.tensor([[0, 5, 39], [12, 12, 1]])
    assert torch.equal(loaded.to_target_ids(draft_ids), kept[draft_ids])
    ids, hidden, _, cos, sin, mask = _inputs(loaded)
    assert loaded(ids, hidden, cos, sin, mask)[0].shape == (2, 7, 40)


def test_midlayer_prefix_is_accepted(tmp_path):
    draft = _draft()
    save_eagle3(draft, tmp_path, num_speculative_tokens=1, **LLAMA_TARGET)
    tensors = load_file(tmp_path / "model.safetensors")
    renamed = {n.replace("layers.0.", "midlayer."): t for n, t in tensors.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    _assert_same(draft, load_eagle3(tmp_path, EMBEDDING))


def _saved(tmp_path, config_overrides=None, drop=(), tensors=None) -> None:
    save_eagle3(_draft(), tmp_path, num_speculative_tokens=1, **LLAMA_TARGET)
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value in (config_overrides or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "model.safetensors")
    weights = {n: t for n, t in weights.items() if n not in drop} | (tensors or {})
    save_file(weights, str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize(
    "overrides, sizes, message",
    [
        (
            {},
            {"vocab_size": 128},
            "transformer_layer_config.vocab_size 100 is not the target's 128",
        ),
        ({}, {"hidden_size": 32}, "target_hidden_size 64 is not the target's 32"),
        ({"target_hidden_size": 80}, {"hidden_size": 64}, "target_hidden_size 80 is not the"),
        ({"speculators_model_type": "eagle"}, {}, "speculators_model_type 'eagle' \\(expected"),
        ({"speculators_model_type": None}, {}, "speculators_model_type None"),
        ({"transformer_layer_config": None}, {}, "transformer_layer_config missing"),
        ({"draft_vocab_size": 101}, {}, "draft_vocab_size 101 exceeds vocab_size 100"),
        ({"draft_vocab_size": 0}, {}, "draft_vocab_size must be a positive integer"),
        ({"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}, {}, "must be 3 layers in \\[0, 3\\]"),
        ({"eagle_aux_hidden_state_layer_ids": [0, 2, 2]}, {}, "must be distinct and ascending"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 2]}, {}, "must be 3 layer indices"),
        ({"norm_before_fc": True}, {}, "norm_before_fc not supported"),
    ],
)
def test_a_config_that_cannot_serve_the_target_is_refused(tmp_path, overrides, sizes, message):
    _saved(tmp_path, overrides)
    with pytest.raises(Eagle3Error, match=message) as error:
        load_eagle3_config(tmp_path, 4, **sizes)
    assert str(tmp_path / "config.json") in str(error.value)


def test_config_defaults_are_vllms(tmp_path):
    absent = {"eagle_aux_hidden_state_layer_ids": None, "norm_before_residual": None}
    _saved(tmp_path, absent | {"target_hidden_size": None, "draft_vocab_size": None})
    cfg = load_eagle3_config(tmp_path, 32, vocab_size=V, hidden_size=H)
    assert cfg.aux_layers == (2, 16, 29) and cfg.norm_before_residual is True
    assert cfg.draft_vocab_size == V and cfg.target_hidden_size == H and not cfg.has_embedding
    with pytest.raises(Eagle3Error, match="no eagle_aux_hidden_state_layer_ids"):
        load_eagle3(tmp_path, EMBEDDING)  # vLLM's default needs the target's depth
    assert load_eagle3(tmp_path, EMBEDDING, target_num_layers=4).cfg.aux_layers == (1, 2, 3)


@pytest.mark.parametrize(
    "drop, tensors, message",
    [
        (("norm.weight",), {}, "missing tensors \\['norm.weight'\\]"),
        ((), {"lm_head.weight": torch.zeros(V, 8)}, "lm_head.weight \\[100, 8\\] \\(expected"),
        ((), {"fc.weight": torch.zeros(H, 2 * H)}, "fc.weight \\[64, 128\\] \\(expected"),
        ((), {"d2t": torch.full((V,), 1)}, "d2t maps draft ids outside"),
    ],
)
def test_tensors_that_do_not_fit_are_named(tmp_path, drop, tensors, message):
    _saved(tmp_path, drop=drop, tensors=tensors)
    with pytest.raises(Eagle3Error, match=message) as error:
        load_eagle3(tmp_path, EMBEDDING)
    assert str(tmp_path) in str(error.value)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, T, heads, D] rotated rotate-half style at positions [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).double() / d)  # [D/2]
    angle = (positions.double()[..., None] * inv).float()[:, :, None]  # [B, T, 1, D/2]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)


def _reference(draft: Eagle3Draft, ids, hidden, positions):
    """The contract's formula with the weights read by name: (logits, prenorm)."""
    w = draft.state_dict()
    layer, eps = draft.cfg.layer, draft.cfg.layer.rms_norm_eps
    b, t = ids.shape
    nh, nkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    e = _rms(draft.embed_tokens.weight[ids], w["layers.0.input_layernorm.weight"], eps)
    if draft.cfg.norm_before_residual:
        hn = _rms(hidden, w["layers.0.hidden_norm.weight"], eps)
        residual = hn
    else:
        residual = hidden
        hn = _rms(hidden, w["layers.0.hidden_norm.weight"], eps)
    x = torch.cat([e, hn], -1)  # [B, T, 2H]
    q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(b, t, nh, d)
    k = (x @ w["layers.0.self_attn.k_proj.weight"].T).view(b, t, nkv, d)
    v = (x @ w["layers.0.self_attn.v_proj.weight"].T).view(b, t, nkv, d)
    q, k = _rotate(q, positions, layer.rope.theta), _rotate(k, positions, layer.rope.theta)
    k, v = k.repeat_interleave(nh // nkv, 2), v.repeat_interleave(nh // nkv, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    a = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, nh * d)
    residual = residual + a @ w["layers.0.self_attn.o_proj.weight"].T
    m = _rms(residual, w["layers.0.post_attention_layernorm.weight"], eps)
    gate, up = m @ w["layers.0.mlp.gate_proj.weight"].T, m @ w["layers.0.mlp.up_proj.weight"].T
    prenorm = (
        residual + (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T
    )
    return _rms(prenorm, w["norm.weight"], eps) @ w["lm_head.weight"].T, prenorm


@pytest.mark.parametrize("norm_before_residual", [True, False])
def test_forward_is_the_contracts_formula(norm_before_residual):
    draft = _draft(_config(norm_before_residual=norm_before_residual))
    ids, hidden, positions, cos, sin, mask = _inputs(draft)
    with torch.no_grad():
        logits, prenorm, (k, v) = draft(ids, hidden, cos, sin, mask)
        want_logits, want_prenorm = _reference(draft, ids, hidden, positions)
    torch.testing.assert_close(prenorm, want_prenorm, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert k.shape == v.shape == (2, 2, 7, 16)


def test_one_token_at_a_time_equals_the_whole_sequence():
    draft = _draft()
    ids, hidden, positions, cos, sin, mask = _inputs(draft, t=6)
    with torch.no_grad():
        whole_logits, whole_prenorm, whole_kv = draft(ids, hidden, cos, sin, mask)
        past = None
        for i in range(6):
            step = slice(i, i + 1)
            sees_all = torch.ones(2, 1, 1, i + 1, dtype=torch.bool)  # [B, 1, 1, P+1]
            logits, prenorm, past = draft(
                ids[:, step], hidden[:, step], cos[:, step], sin[:, step], sees_all, past
            )
            torch.testing.assert_close(logits, whole_logits[:, step], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(prenorm, whole_prenorm[:, step], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(past[0], whole_kv[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(past[1], whole_kv[1], rtol=1e-5, atol=1e-5)


def test_for_target_starts_from_the_targets_head_and_embedding():
    lm_head = torch.randn(V, H)
    draft = Eagle3Draft.for_target(TARGET, (1, 2, 3), lm_head, EMBEDDING, seed=3)
    again = Eagle3Draft.for_target(TARGET, (1, 2, 3), lm_head, EMBEDDING, seed=3)
    _assert_same(draft, again)  # seeded
    assert torch.equal(draft.lm_head.weight, lm_head) and draft.lm_head.weight is not lm_head
    assert torch.equal(draft.embed_tokens.weight, EMBEDDING)  # shared, frozen, not saved
    trained = {name for name, _ in draft.named_parameters()}
    assert "embed_tokens.weight" not in trained and "fc.weight" in trained
    assert "embed_tokens.weight" not in draft.state_dict()
    assert draft.cfg.layer.num_layers == 1 and draft.cfg.draft_vocab_size == V
    assert float(draft.fc.weight.detach().std()) == pytest.approx(0.02, rel=0.1)


def test_a_trained_drafts_config_round_trips(tmp_path):
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    target = model_config(vocab_size=V, rope_theta=5e5, rope_scaling=llama3)
    draft = Eagle3Draft.for_target(target, (1, 1, 0), torch.randn(V, H), EMBEDDING, seed=0)
    save_eagle3(draft, tmp_path, num_speculative_tokens=2, **LLAMA_TARGET)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["transformer_layer_config"]["rope_scaling"]["rope_type"] == "llama3"
    assert config["norm_before_residual"] is True
    loaded = load_eagle3(tmp_path, EMBEDDING)
    assert loaded.cfg == draft.cfg and loaded.cfg.layer.rope.type == "llama3"
    _assert_same(draft, loaded)
