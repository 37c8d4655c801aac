"""The IR's logits match transformers' (fp32) for every supported architecture and RoPE variant."""

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.load import CheckpointError, load_model

from fixtures import make_checkpoint

VARIANTS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-qkv-bias": ("llama", {"attention_bias": True}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "llama-linear-rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-dynamic-rope": (
        "llama",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 32},
    ),
    "llama3-rope": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            "rope_theta": 500000.0,
        },
    ),
    "mistral-sliding": ("mistral", {"sliding_window": 12}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    # Per-head q/k norms, head_dim apart from hidden / heads, tied; and with every bias and a
    # window on the layers from max_window_layers on (a mix).
    "qwen3": ("qwen3", {"tie_word_embeddings": True, "head_dim": 32}),
    "qwen3-bias-mixed": (
        "qwen3",
        {
            "attention_bias": True,
            "use_sliding_window": True,
            "sliding_window": 12,
            "max_window_layers": 1,
        },
    ),
    # transformers slides the layers from max_window_layers on: all of them, or none (28).
    "qwen2-sliding": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 0},
    ),
    "qwen2-window-on-no-layer": ("qwen2", {"use_sliding_window": True, "sliding_window": 12}),
    # Local and global layers mixed: layer 0 global, layer 1 local (max_window_layers 1), and
    # local / global / local named by layer_types; the prompts (48 tokens) pass the window.
    "qwen2-mixed": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 1},
    ),
    "qwen2-mixed-layer-types": (
        "qwen2",
        {
            "use_sliding_window": True,
            "sliding_window": 12,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return make_checkpoint(tmp_path_factory.mktemp(request.param), arch, **overrides)


def test_logits_match_transformers(checkpoint):
    ir = load_model(checkpoint)
    ref = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = torch.randint(0, ir.cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _, _ = ir(ids)
        theirs = ref(ids).logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_cached_decoding_matches_full_forward(checkpoint):
    ir = load_model(checkpoint)
    ids = torch.randint(0, ir.cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _, _ = ir(ids)
        _, _, cache = ir(ids[:, :12])
        step, _, _ = ir(ids[:, 12:], cache=cache)
    if ir.cfg.rope.type == "dynamic":
        # Dynamic NTK recomputes frequencies per call, so cached keys differ (as in transformers).
        return
    torch.testing.assert_close(step, full[:, 12:], atol=1e-4, rtol=0)


def test_pickle_weights_refused(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m")
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        load_model(ckpt)


def test_mixed_layers_each_keep_their_own_window(tmp_path):
    """The mixed variant above is neither the window on every layer nor on none: both of
    those give other logits (so the parity above checks the per-layer rule)."""
    mixed = {"use_sliding_window": True, "sliding_window": 12}
    ckpt = make_checkpoint(tmp_path, "qwen2", max_window_layers=1, **mixed)
    ir = load_model(ckpt)
    assert ir.cfg.layer_windows == (None, 12) and ir.cfg.sliding_window == 12
    ids = torch.randint(0, ir.cfg.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = ir(ids)[0]
        for windows in ((12, 12), (None, None)):
            ir.cfg = replace(ir.cfg, layer_windows=windows)
            for i, layer in enumerate(ir.layers):
                layer.window = windows[i]
            assert (ir(ids)[0] - ours).abs().max() > 1e-3


def test_unsupported_architecture_named():
    with pytest.raises(ConfigError, match="'gpt2'"):
        ModelConfig.from_hf({"model_type": "gpt2"})


def test_shape_mismatch_names_tensor(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m")
    cfg = ModelConfig.from_dir(ckpt)
    wrong = ModelConfig.from_dict({**cfg.to_dict(), "intermediate_size": 96})
    with pytest.raises(CheckpointError, match="mlp"):
        load_model(ckpt, wrong)
