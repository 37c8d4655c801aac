"""The tokenizer the generation tests' fake sessions decode with, and the tiny artifact with
both engines the openvino tests compare."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # generator_support, beside this file

from ingot.runtime.tokenizer import TextTokenizer  # noqa: E402

from fixtures import openvino_artifact_of, write_tokenizer  # noqa: E402
from generator_support import V  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, V)
    return TextTokenizer(path / "tokenizer.json")


@pytest.fixture(scope="session")
def openvino_artifact(tmp_path_factory) -> Path:
    return openvino_artifact_of(tmp_path_factory, "ov-llama")
