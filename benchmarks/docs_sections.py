"""Shared by the benchmark tools: replace one `## ` section of docs/benchmarks.md, keep the rest."""
from __future__ import annotations

from pathlib import Path


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
