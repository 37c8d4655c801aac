"""tests/pipeline on the path: a test module may reuse another's helpers (the speculative
evaluation builds its recipes with test_speculative_build's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
