"""Fixtures of the sweep's executors and speed runs: one tiny checkpoint, its recipes, and one
artifact built from them (each test builds into its own stage cache unless it shares one)."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from fixtures import make_checkpoint, write_recipe


@pytest.fixture(scope="session")
def sweep_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("sweep-ckpt") / "llama", "llama")


@pytest.fixture(scope="session")
def sweep_recipes(tmp_path_factory, sweep_checkpoint) -> dict[str, Path]:
    """Two valid variants (RTN g32 and g64) and one the recipe check refuses (3 bits)."""
    root = tmp_path_factory.mktemp("sweep-recipes")

    def variant(name: str, **entry) -> Path:
        quantize = {"method": "rtn", "bits": 4, "group_size": 32, "ignore": ["lm_head"], **entry}
        return write_recipe(root / f"{name}.yaml", sweep_checkpoint, quantize=[quantize])

    good = {"g32": variant("g32"), "g64": variant("g64", group_size=64)}
    return {**good, "bad": variant("bad", bits=3)}


@pytest.fixture(scope="session")
def sweep_artifact(tmp_path_factory, sweep_recipes) -> Path:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    root = tmp_path_factory.mktemp("sweep-artifact")
    return build(sweep_recipes["g32"], root / "g32", cache=StageCache(root / "cache")).artifact


@pytest.fixture(scope="session")
def local_outcomes(tmp_path_factory, sweep_recipes):
    """The three variants built by the local executor, two at a time, into one shared cache
    (the Ray test compares its artifacts with these). One torch thread, as a Ray task with one
    CPU gets (Ray sets OMP_NUM_THREADS): the engine check's float error, which the artifact
    records, depends on torch's thread count."""
    from ingot.pipeline.sweep.executor import BuildJob, make_executor

    root = tmp_path_factory.mktemp("sweep-local")
    jobs = [BuildJob(n, sweep_recipes[n], root / n, root / "cache") for n in ("g32", "bad", "g64")]
    with mock.patch.dict(os.environ, {"OMP_NUM_THREADS": "1"}):  # the build processes inherit it
        return make_executor("local", jobs=2).run(jobs)
