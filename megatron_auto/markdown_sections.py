"""Generated sections of a markdown file, kept between a begin and an end marker line (the README's patch
table, `python -m patches`, and its flag-verdict table, `python -m megatron_auto.train.flag_table`)."""
from __future__ import annotations

import re
import sys
from pathlib import Path


def marked_section(text: str, begin: str, end: str) -> str:
    """The section from `begin` to `end` as it stands in `text`; empty when a marker is missing."""
    match = re.search(re.escape(begin) + r".*?" + re.escape(end), text, re.S)
    return match.group(0) if match else ""


def replace_marked_section(path: Path, begin: str, end: str, section: str) -> bool:
    """Put `section` (markers included) in place of the marked one in the file at `path`; True when the text
    changed. A file without the markers is one line on stderr and exit status 2."""
    text = path.read_text()
    old = marked_section(text, begin, end)
    if not old:
        sys.stderr.write(f"{path}: no generated-section markers ({begin!r} ... {end!r})\n")
        raise SystemExit(2)
    new_text = text.replace(old, section)
    path.write_text(new_text)
    return new_text != text
