import sys
from pathlib import Path

# The launcher and worker live beside the tests; the repository root holds `patches`.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
