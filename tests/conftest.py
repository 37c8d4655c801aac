import sys
from pathlib import Path

# tests/fixtures.py is shared by every test module.
sys.path.insert(0, str(Path(__file__).parent))
