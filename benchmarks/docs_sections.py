"""Shared by the benchmark tools: replace one `## ` section of docs/benchmarks.md, keep the rest."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def replace_section(text: str, heading: str, body: str) -> str:
    """`text` with the section that starts at `heading` (up to the next `## `) replaced by `body`;
    `body` is appended when the heading is absent."""
    start = text.find(heading)
    if start < 0:
        return text.rstrip() + "\n\n" + body
    end = text.find("\n## ", start + len(heading))
    return text[:start] + body + (text[end + 1:] if end >= 0 else "")


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) the section of the markdown file at `path` that starts at `heading`
    (a new file starts with `# Benchmarks`); the file ends in one newline."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    path.write_text(replace_section(text, heading, body).rstrip() + "\n")


def add_ab_arguments(parser: argparse.ArgumentParser, launches: int) -> None:
    """The in-process A/B flags the runtime benchmarks share (benchmarks/ab_steps.py), and --no-docs."""
    parser.add_argument("--blocks", type=int, default=300, help="ABBA blocks per in-process A/B launch")
    parser.add_argument("--launches", type=int, default=launches, help="in-process A/B launches")
    parser.add_argument("--no-docs", action="store_true", help="print the section, leave docs/benchmarks.md alone")


def publish(heading: str, text: str, no_docs: bool) -> None:
    """Write `text` as the `heading` section of docs/benchmarks.md (unless `no_docs`), and print it."""
    if not no_docs:
        write_section(BENCHMARKS_MD, heading, text)
    sys.stdout.write(text)
