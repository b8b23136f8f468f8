import sys
from pathlib import Path

# The workers live beside the tests; the repository root holds `patches` and `validation` (the launcher).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
