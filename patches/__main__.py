"""Rewrite the README's patch table from patches/registry.py: `python -m patches [README.md]`."""
from __future__ import annotations

import sys
from pathlib import Path

from patches.registry import write_readme

if __name__ == "__main__":
    write_readme(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "README.md")
