import sys
from pathlib import Path

import pytest

# Before tests/ goes on the path: there, tests/ingot/ (no __init__.py) would be found first as
# a namespace package `ingot`, and `from ingot import LLM` would fail.
import ingot  # noqa: F401

# tests/fixtures.py is shared by every test module.
sys.path.insert(0, str(Path(__file__).parent))


def _no_cuda_reason() -> str | None:
    """Why tests marked `gpu` cannot run here, or None when a CUDA device is present."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device: torch.cuda.is_available() is False"
    return None


def pytest_collection_modifyitems(config, items):
    # `gpu` tests are collected everywhere and skipped, with the reason, where there is no CUDA
    # device (`-ra` lists the reason in the summary). torch is imported only if one is collected.
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _no_cuda_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory) -> Path:
    """The embedded demo, built from recipes/demo.yaml as `ingot build` builds it (its own
    stage cache): what README's examples run on (tests/test_readme_examples.py)."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    root = tmp_path_factory.mktemp("demo")
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "demo.yaml"
    return build(recipe, root / "demo", cache=StageCache(root / "cache")).artifact
