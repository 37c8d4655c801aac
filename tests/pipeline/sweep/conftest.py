"""tests/pipeline/sweep on the path: the end-to-end sweep checks its flags with
test_pareto_pick's brute force."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
