"""The checks every model family passes (issue 29's "how to tell"), on checkpoints transformers
makes itself from a config, so the oracle is transformers' own code:

- `tiny_checkpoint`: random weights of a tiny shape with the family's features switched on;
  `trained_checkpoint`: the same trained a few hundred steps on the demo's text with the demo's
  tokenizer, so perplexity means something;
- `assert_ir_matches_transformers`: the IR's fp32 logits against transformers';
- `engine_and_reference`: the built engine's greedy tokens and transformers' greedy tokens on the
  quantized IR's dequantized weights (written as an HF checkpoint), prompt by prompt;
- `gated_build`: a build whose evaluate.perplexity gate judges the engine on the model's own
  text;
- `compressed_tensors_and_ir`: transformers' logits on the compressed-tensors export against
  the IR's.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.interop.common import split_model
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.model.llama import LlamaModel
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe import load_recipe
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import BASE, write_recipe, write_tokenizer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"
DEMO_TEXT = DEMO / "pydoc-heldin.txt"
TRAINED_VOCAB = 512

# The shape every family's checks run at (HF key names): the other tests' tiny Llama, with no
# padding token (Phi-3's default, 32000, is outside this vocabulary); a family's test adds its
# features.
TINY: dict[str, Any] = {**BASE, "pad_token_id": None}
WINDOW = 16  # the sliding window a family's test gives its local layers
_HEAD_FLOAT = {"ignore": ["lm_head"]}
GPTQ_W4 = [{"method": "gptq", "bits": 4, "group_size": 32, "symmetric": True, **_HEAD_FLOAT}]
W8A8 = [{"method": "smoothquant", "weights": "gptq", "activations": "dynamic", **_HEAD_FLOAT}]
AWQ_W4 = [{"method": "awq", "bits": 4, "group_size": 32, "symmetric": False, **_HEAD_FLOAT}]
FP8 = [{"method": "fp8", "weights": "channel", "activations": "dynamic", **_HEAD_FLOAT}]
# The schemes every family's gated builds run: (quantize, other recipe fields).
SCHEMES: dict[str, tuple[list[dict], dict[str, Any]]] = {
    "gptq-w4": (GPTQ_W4, {}),
    "w8a8-int8-kv": (W8A8, {"kv_cache": {"dtype": "int8", "block_size": 16}}),
    "awq-w4": (AWQ_W4, {}),
    "fp8": (FP8, {}),
}
# Four prompts, the last longer than WINDOW tokens with fixtures.write_tokenizer's tokenizer.
PROMPTS = [
    "def add(a, b):",
    "import os",
    "Lists, tuples and dictionaries",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
]
# Targets computing in fp32 (activations not quantized): each engine computes the dequantized
# weights' numbers, so greedy tokens compare one for one.
EXACT_TARGETS = {
    "onnxruntime": {"engine": "onnxruntime", "matmul_accuracy_level": 0},
    "openvino": {"engine": "openvino", "dynamic_quantization": False},
}
ENGINES = ("onnxruntime", "openvino")


def tiny_checkpoint(path: Path, model_type: str, seed: int = 0, **config: Any) -> Path:
    """A random-weight checkpoint of `model_type` made and saved by transformers, at TINY's
    shape with `config` over it. Weights are widened (std 0.15; norms' and biases' too) so
    logits, every norm and quantization error are far from trivial."""
    torch.manual_seed(seed)
    hf_config = AutoConfig.for_model(model_type, **{**TINY, **config})
    model = AutoModelForCausalLM.from_config(hf_config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    write_tokenizer(path, hf_config.vocab_size)
    return path


def trained_checkpoint(
    path: Path, model_type: str, steps: int = 300, seq_len: int = 64, **config: Any
) -> Path:
    """`model_type` at TINY's shape (with `config`) and a 512-token BPE of the demo's text,
    trained `steps` AdamW steps of 8 x `seq_len` tokens on that text
    (recipes/demo/pydoc-heldin.txt): the model's own text, on which perplexity means
    something. Small on purpose: a few seconds per family on two cores."""
    from tokenizers import Tokenizer  # the tokenizer just written, as the runtime reads it

    path.mkdir(parents=True, exist_ok=True)
    text = DEMO_TEXT.read_text()
    write_tokenizer(path, TRAINED_VOCAB, corpus=text.split("\n\n"))
    data = torch.tensor(Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids)
    torch.manual_seed(0)
    # Three layers: an EAGLE-3 draft reads three distinct layers of its target.
    fields = {**TINY, "vocab_size": TRAINED_VOCAB, "num_hidden_layers": 3, **config}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = random.Random(0)
    model.train()
    threads = torch.get_num_threads()
    # One thread: these matrices are too small to split, and two threads contending with
    # other work on two cores run some twenty times slower.
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            starts = [rng.randrange(len(data) - seq_len) for _ in range(8)]
            batch = torch.stack([data[s : s + seq_len] for s in starts])  # [8, seq_len]
            model(batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.eval().save_pretrained(path)
    return path


def assert_ir_matches_transformers(ckpt: Path, seq_len: int = 40) -> None:
    """The IR's logits equal transformers' (fp32) on two random sequences of `seq_len`
    tokens, within 1e-4 of the logits' scale."""
    ir = load_model(ckpt)
    ref = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ir.cfg.vocab_size, (2, seq_len), generator=g)
    with torch.no_grad():
        want = ref(ids).logits
        got = ir(ids)[0]
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, atol=1e-4 * max(scale, 1.0), rtol=0)


def engine_and_reference(
    ckpt: Path,
    work: Path,
    recipe: dict[str, Any] | None = None,
    engines: tuple[str, ...] = ENGINES,
    max_tokens: int = 32,
) -> list[tuple[list[int], dict[str, list[int]], list[int]]]:
    """Build `ckpt` (write_recipe's RTN int4 g32 with `recipe` over it, an exact target for each
    of `engines`, KV blocks of 32: OpenVINO's CPU plugin's) and generate greedily from the
    artifact on each engine; the same prompts through transformers on the quantized IR's
    dequantized weights. Returns (prompt ids, {engine: its tokens}, transformers' tokens) per
    prompt of PROMPTS."""
    fields = {
        "targets": [EXACT_TARGETS[e] for e in engines],
        "kv_cache": {"dtype": "fp32", "block_size": 32},
        **(recipe or {}),
    }
    work.mkdir(parents=True, exist_ok=True)
    path = write_recipe(work / "recipe.yaml", ckpt, **fields)
    artifact = build(path, work / "artifact", cache=StageCache(work / "cache")).artifact
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    runs = {
        e: LoadedModel.load(artifact, engine=e).generator().generate(PROMPTS, greedy)
        for e in engines
    }

    model = load_model(ckpt)
    quantize_model(model, load_recipe(path).quantize)
    ref = dequantized_transformers(model, ckpt, work / "dequantized")
    prompts = [c.prompt_token_ids for c in runs[engines[0]]]
    return [
        (
            prompt,
            {e: list(runs[e][i].token_ids) for e in engines},
            _greedy(ref, prompt, max_tokens),
        )
        for i, prompt in enumerate(prompts)
    ]


def dequantized_transformers(model: LlamaModel, source: Path, out: Path) -> torch.nn.Module:
    """transformers' model of `source`'s config on `model`'s weights, quantized linears
    dequantized (fp32), written as an HF checkpoint under the family's HF tensor names."""
    cfg: ModelConfig = model.cfg
    quantized, dense = split_model(model)
    tensors = dict(dense)
    for name, q in quantized.items():
        tensors[f"{name}.weight"] = q.dequantize()
        if q.bias is not None:
            tensors[f"{name}.bias"] = q.bias
    names = cfg.family.tensor_names
    hf = {names.to_hf(n): t.detach().float().contiguous() for n, t in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(source / "config.json", out / "config.json")
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


@torch.no_grad()
def _greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy continuation, a full forward per token (no cache to trust)."""
    seq = list(prompt)
    for _ in range(max_tokens):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


# The gate of `gated_build`: perplexity may rise this much (absolute) from the float model's
# (~41 for the trained tiny models: 2.4%). GPTQ W4 costs ~0.1 there, W8A8 ~0.01.
MAX_DELTA = 1.0


def gated_build(ckpt: Path, work: Path, quantize: list[dict], **recipe: Any) -> dict[str, Any]:
    """Build `ckpt` with `quantize`, calibrated on and gated by the demo's text (the trained
    checkpoint's own; MAX_DELTA), int8 activations (the default target); returns the eval
    report's perplexity block. The build fails when the gate does."""
    text = str(DEMO_TEXT)
    perplexity = {"dataset": text, "seq_len": 128, "max_windows": 8, "max_delta": MAX_DELTA}
    fields = {
        "quantize": quantize,
        "calibration": {"dataset": text, "samples": 16, "seq_len": 128, "seed": 0},
        "evaluate": {"perplexity": perplexity},
        "export": {"max_seq_len": 256},
        **recipe,
    }
    work.mkdir(parents=True, exist_ok=True)
    path = write_recipe(work / "recipe.yaml", ckpt, **fields)
    artifact = build(path, work / "artifact", cache=StageCache(work / "cache")).artifact
    return json.loads((artifact / "eval" / "report.json").read_text())["perplexity"]


def compressed_tensors_and_ir(ckpt: Path, work: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(transformers' logits on the compressed-tensors export of `ckpt` quantized RTN int4 g32
    (lm_head float), the IR's on the same weights with its float tensors rounded to fp16 as
    the export holds them), on two random sequences of 40 tokens."""
    from ingot.pipeline.interop import write_interop
    from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
    from ingot.pipeline.recipe.quantize import quantize_entry

    model = load_model(ckpt)
    entry = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True}
    quantize_model(model, [quantize_entry({**entry, "ignore": ["lm_head"]})])
    ir = work / "ir"
    ir.mkdir(parents=True)
    save_ir(model, ir)
    write_interop("compressed-tensors", ir, ckpt, work / "ct")
    hf = AutoModelForCausalLM.from_pretrained(work / "ct", dtype=torch.float32).eval()
    model = load_ir(ir)
    ids = torch.randint(
        0, model.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
        return hf(ids).logits, model(ids)[0]


# The speculative sections `speculative_and_plain` builds: an EAGLE-3 layer and Medusa heads
# trained briefly in the build, a draft model (a second trained checkpoint of the family).
EAGLE = {
    "method": "eagle",
    "num_speculative_tokens": 3,
    "heads": {"train": {"steps": 20, "batch_size": 8, "span": 64, "ttt_steps": 2, "seed": 0}},
}
MEDUSA = {
    "method": "medusa",
    "num_speculative_tokens": 3,
    "heads": {"train": {"num_heads": 3, "steps": 60, "batch_size": 16, "seed": 0}},
}


def speculative_and_plain(
    ckpt: Path, work: Path, speculative: dict[str, Any], max_tokens: int = 32
) -> tuple[list[list[int]], list[list[int]], Any]:
    """Build `ckpt` (RTN int4 g32, an exact onnxruntime target) with `speculative`, then
    generate PROMPTS greedily with and without it: (speculative tokens, plain tokens, the
    speculation's stats)."""
    text = str(DEMO_TEXT)
    fields = {
        "targets": [EXACT_TARGETS["onnxruntime"]],
        "calibration": {"dataset": text, "samples": 16, "seq_len": 128, "seed": 0},
        "export": {"max_seq_len": 256},
        "speculative": speculative,
    }
    work.mkdir(parents=True, exist_ok=True)
    path = write_recipe(work / "recipe.yaml", ckpt, **fields)
    artifact = build(path, work / "artifact", cache=StageCache(work / "cache")).artifact
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    plain = LoadedModel.load(artifact, speculative_config=False).generator()
    drafting = LoadedModel.load(artifact).generator()
    want = [list(c.token_ids) for c in plain.generate(PROMPTS, greedy)]
    got = [list(c.token_ids) for c in drafting.generate(PROMPTS, greedy)]
    return got, want, drafting.speculation.stats
