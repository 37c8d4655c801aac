"""The benchmarks package is imported by its name from the repository root: `python -m pytest`
puts the working directory on sys.path, a bare `pytest` does not, so the root goes on it here
(after tests/, which tests/conftest.py puts first: a regular package wins over tests/benchmarks,
which has no __init__.py)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))
