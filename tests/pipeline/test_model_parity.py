"""The IR's logits match transformers' (fp32) for every supported architecture and RoPE variant."""

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
    # transformers slides the layers from max_window_layers on: all of them, or none (28).
    "qwen2-sliding": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 0},
    ),
    "qwen2-window-on-no-layer": ("qwen2", {"use_sliding_window": True, "sliding_window": 12}),
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


def test_mixed_local_and_global_layers_are_refused_not_run_wrong(tmp_path):
    ckpt = make_checkpoint(
        tmp_path, "qwen2", use_sliding_window=True, sliding_window=12, max_window_layers=1
    )
    with pytest.raises(ConfigError, match=r"layers \[1\] of 2 slide .* not supported yet"):
        load_model(ckpt)


def test_unsupported_architecture_named():
    with pytest.raises(ConfigError, match="'gpt2'"):
        ModelConfig.from_hf({"model_type": "gpt2"})


def test_shape_mismatch_names_tensor(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m")
    cfg = ModelConfig.from_dir(ckpt)
    wrong = ModelConfig.from_dict({**cfg.to_dict(), "intermediate_size": 96})
    with pytest.raises(CheckpointError, match="mlp"):
        load_model(ckpt, wrong)
