"""The quantize benchmarks' data and scores: calibration windows (ingot's sampler, saved for
both tools), the perplexity windows of the in-domain and the out-of-domain text, and each
row's perplexity and KL(fp32 || quantized) on them, by ingot's evaluate code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DOMAINS",
    "KL",
    "OOD_FILES",
    "calibration_tokens",
    "eval_windows",
    "evaluation",
    "ood_windows",
    "perplexity_scores",
]

# The out-of-domain text: legal prose (Debian's copies of the licences; GPL-2 is left out, as
# LGPL-2.1 repeats much of it), joined by blank lines.
OOD_FILES = tuple(
    Path("/usr/share/common-licenses") / name
    for name in ("GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1")
)
# eval text -> a row's keys: perplexity, and the mean per-token KL(fp32 || quantized) in nats
DOMAINS = {"in": "perplexity", "ood": "perplexity_ood"}
KL = {"in": "kl", "ood": "kl_ood"}


def calibration_tokens(work: Path, samples: int, model: Path, text: Path, seed: int = 0) -> Path:
    """ingot's calibration sampler over the calibration text, saved for both tools."""
    from ingot.calibration.dataset import load_calibration

    config = json.loads((model / "config.json").read_text())
    section = {
        "dataset": str(text),
        "split": "train",
        "text_field": "text",
        "samples": samples,
        "seq_len": 512,
        "seed": seed,
    }
    calibration = load_calibration(
        section, model / "tokenizer.json", eos_token_id=config["eos_token_id"]
    )
    path = work / (f"calib-{samples}x512.npy" if seed == 0 else f"calib-{samples}x512-s{seed}.npy")
    np.save(path, np.asarray(calibration.tokens, dtype=np.int64))
    return path


def eval_windows(model: Path, eval_text: Path, max_windows: int | None):
    from ingot.pipeline.evaluate import load_eval_text, token_windows
    from ingot.pipeline.evaluate.perplexity import tokenize

    text = load_eval_text(str(eval_text))
    ids = tokenize(text.text, model / "tokenizer.json")
    return token_windows(ids, 256, max_windows), text.sha256


def evaluation(eval_text: Path, digest: str, windows: np.ndarray) -> dict[str, Any]:
    """The report's description of the in-domain perplexity windows [W, T]."""
    return {
        "dataset": eval_text.name,
        "text_sha256": digest,
        "seq_len": int(windows.shape[1]),
        "windows": int(windows.shape[0]),
    }


def ood_windows(model: Path, files: list[Path], max_windows: int | None):
    """The out-of-domain windows: ``files`` (plain text) joined by blank lines; with the
    description the report records (each file's path and sha256, the joined text's)."""
    from ingot.pipeline.evaluate import token_windows
    from ingot.pipeline.evaluate.perplexity import tokenize

    texts = [f.read_text(encoding="utf-8") for f in files]
    text = "\n\n".join(t.strip("\n") for t in texts)
    ids = tokenize(text, model / "tokenizer.json")
    windows = token_windows(ids, 256, max_windows)
    sha = [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    described = {
        "dataset": "legal prose (licence texts)",
        "files": [{"path": str(f), "sha256": h} for f, h in zip(files, sha, strict=True)],
        "text_sha256": "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokens": len(ids),
        "seq_len": 256,
        "windows": int(windows.shape[0]),
    }
    return windows, described


def perplexity_scores(
    kind: str, path: Path, windows: dict[str, Any], reference: Any = None
) -> dict[str, float]:
    """{row key: value} on each text's windows (``windows``: domain -> windows): perplexity, by
    ingot's evaluate code, and with the fp32 ``reference`` model the mean KL(fp32 || this
    model) over the same next-token predictions, in nats. Perplexity says how well a model
    predicts the text, which quantization noise can even improve where the float model is
    overconfident (out of domain); the KL says how far its predictions moved from the float
    model's, in either direction."""
    from ingot.pipeline.model.load import load_model
    from ingot.pipeline.quantize.checkpoint import load_ir

    model = load_ir(path) if kind == "ir" else load_model(path)
    scores = {}
    for domain, w in windows.items():
        ppl, kl = _scores(model, w, reference)
        scores[DOMAINS[domain]] = ppl
        if kl is not None:
            scores[KL[domain]] = kl
    return scores


def _scores(model: Any, windows: Any, reference: Any) -> tuple[float, float | None]:
    """(perplexity, mean KL from ``reference`` | None): ingot's `perplexity` runs the model;
    each batch's logits are compared with the reference's on the way."""
    import torch

    from ingot.pipeline.evaluate import perplexity

    kl = [0.0, 0]  # summed in float64, predictions

    def forward(batch: torch.Tensor) -> tuple[torch.Tensor]:
        logits = model(batch)[0]
        if reference is not None:
            logq = torch.log_softmax(logits[:, :-1].float(), -1)
            logp = torch.log_softmax(reference(batch)[0][:, :-1].float(), -1)
            kl[0] += float((logp.exp() * (logp - logq)).sum(dtype=torch.float64))
            kl[1] += logq.shape[0] * logq.shape[1]
        return (logits,)

    ppl = perplexity(forward, windows)
    return ppl, (kl[0] / kl[1] if reference is not None else None)
