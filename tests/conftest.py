import sys
from pathlib import Path

# Before tests/ goes on the path: there, tests/ingot/ (no __init__.py) would be found first as
# a namespace package `ingot`, and `from ingot import LLM` would fail.
import ingot  # noqa: F401

# tests/fixtures.py is shared by every test module.
sys.path.insert(0, str(Path(__file__).parent))
