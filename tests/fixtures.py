"""Tiny checkpoints and tokenizers built on the fly: tests never need the shared models."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "import os\nprint(os.path.join('a', 'b'))\n",
    "Lists, tuples and dictionaries are the built-in containers of Python.",
]

# The runtime's parity tests run under these schedulers: (prefix caching, KV cache blocks, token
# budget): the plain case, caching off, 16 blocks of 8 = one 128-token sequence (preemption),
# a budget of 8 tokens (chunked prefill).
SCHEDULER_ARGS = ("caching", "kv_cache_blocks", "budget")
SCHEDULER_CASES = [(True, None, 2048), (False, None, 2048), (True, 16, 2048), (True, None, 8)]

# Width of the depth tests (4 vs 16 layers of it: memory must not grow with depth).
DEPTH_WIDTH = dict(
    hidden_size=512,
    intermediate_size=1536,
    vocab_size=4000,
    num_attention_heads=8,
    num_key_value_heads=8,
)

BASE = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=1,
)


def model_config(**overrides):
    """The IR's ModelConfig of a Llama config.json: BASE with `overrides` (HF key names)."""
    from ingot.pipeline.model.config import ModelConfig

    return ModelConfig.from_hf({"model_type": "llama", **BASE, **overrides})


def write_tokenizer(path: Path, vocab_size: int, corpus: list[str] | None = None) -> None:
    """A byte-level BPE with <s>=0, </s>=1, trained on `corpus` (default: a few lines;
    deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE})
    )


def make_checkpoint(path: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """A random-weight HF checkpoint of `arch` (llama | mistral | qwen2 | qwen3) saved as
    safetensors."""
    import torch
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**BASE, **overrides})
    model = model_cls(config).eval()
    # Default init is tiny (std 0.02): widen it so logits and quantization error are non-trivial.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, config.vocab_size)
    return path


# Architectures the end-to-end tests build, with what makes each one different.
ARCHS = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": 24}),
    "qwen2": ("qwen2", {}),
}


def write_recipe(path: Path, source: Path, **overrides) -> Path:
    """A recipe for a tiny checkpoint: RTN int4 g32 (lm_head kept float), blocks of 8."""
    import yaml

    recipe = {
        "source": {"path": str(source)},
        "quantize": [
            {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
        ],
        "kv_cache": {"dtype": "fp32", "block_size": 8},
        "export": {"max_seq_len": 128},
        "artifact": {"name": "tiny"},
    }
    recipe.update(overrides)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    """Write {relative path: bytes} under root (creating folders); returns root."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


# f32 activations, no dynamic quantization: OpenVINO computing as exactly as ONNX Runtime's
# matmul_accuracy_level 0, so greedy tokens can be compared one for one.
EXACT_OPENVINO = {
    "inference_precision": "f32",
    "dynamic_quantization_group_size": 0,
    "num_threads": 0,
}
_KV_PRECISIONS = {"fp32": "f32", "fp16": "f16", "int8": "u8"}


def openvino_record(graph: dict, **session_options) -> dict:
    """The record the build half writes for a graph interface `graph` (the manifest's)."""
    options = {
        **EXACT_OPENVINO,
        "kv_cache_precision": _KV_PRECISIONS[graph["kv_dtype"]],
        **session_options,
    }
    return {
        "name": "openvino-cpu",
        "engine": "openvino",
        "device": "cpu",
        "path": graph["path"],
        "requires": {"openvino": ">=2026.4,<2026.5", "cpu_isa": []},
        "session_options": options,
    }


def with_openvino(built: Path, out: Path, *, first: bool = False, **session_options) -> Path:
    """A copy of the artifact `built` at `out` whose manifest also lists an openvino-cpu
    engine (the record the build half writes: its path is the portable graph, so the runtime
    needs no file of its own), re-written unsigned: after its engines, or before them with
    `first` (the recorded preference)."""
    import shutil

    from ingot.artifacts import read_manifest, write_manifest

    root = Path(shutil.copytree(built, out))
    fields = read_manifest(root).model_dump(mode="json", exclude={"files"})
    record = openvino_record(fields["graph"], **session_options)
    engines = [record, *fields["engines"]] if first else [*fields["engines"], record]
    write_manifest(root, {**fields, "engines": engines})
    return root


def openvino_artifact_of(
    tmp_path_factory, name: str, arch: str = "llama", recipe: dict | None = None, **overrides
) -> Path:
    """A tiny artifact of `arch` with an exact onnxruntime engine (matmul_accuracy_level 0),
    blocks of 32 (the CPU plugin's), and an exact openvino engine after it
    (fixtures.with_openvino): both compute exactly, so greedy tokens compare one for one.
    `recipe`: recipe fields over write_recipe's; `overrides`: the checkpoint's config."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp(name)
    path = write_recipe(
        tmp / "r.yaml",
        make_checkpoint(tmp / "ckpt", arch, **overrides),
        kv_cache={"dtype": "fp32", "block_size": 32},
        targets=[{"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}],
        **(recipe or {}),
    )
    built = build(path, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    return with_openvino(built, tmp / "both")
