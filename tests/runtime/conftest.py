"""The tokenizer the generation tests' fake sessions decode with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # generator_support, beside this file

from ingot.runtime.tokenizer import TextTokenizer  # noqa: E402

from fixtures import write_tokenizer  # noqa: E402
from generator_support import V  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, V)
    return TextTokenizer(path / "tokenizer.json")
