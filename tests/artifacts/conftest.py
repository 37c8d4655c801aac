"""The artifact tests share test_verify's fake artifact (its files and manifest fields)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # test_verify, beside this file
