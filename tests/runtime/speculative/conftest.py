"""The tiny artifact the speculative parity tests decode with, built once for all of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import make_checkpoint, write_recipe

# Exact float matmuls (MatMulNBits accuracy level 0): with int8 activations a verification
# call's rows round differently from a one-token call's, so greedy parity could flip a near-tie.
EXACT = [{"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}]


@pytest.fixture(scope="session")
def exact_artifact(tmp_path_factory) -> Path:
    # The pipeline (torch) loads only when a test builds the artifact.
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("spec-exact")
    recipe = write_recipe(tmp / "r.yaml", make_checkpoint(tmp / "ckpt"), targets=EXACT)
    return build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact
