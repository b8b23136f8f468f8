"""megatron_auto/markdown_sections.py: a generated section between two markers is replaced, nothing else."""
from __future__ import annotations

import pytest

from megatron_auto.markdown_sections import marked_section, replace_marked_section

BEGIN, END = "<!-- begin -->", "<!-- end -->"


def test_only_the_marked_section_is_replaced(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"intro\n{BEGIN}\nold\n{END}\nafter\n")
    assert marked_section(path.read_text(), BEGIN, END) == f"{BEGIN}\nold\n{END}"
    assert replace_marked_section(path, BEGIN, END, f"{BEGIN}\nnew\n{END}")
    assert path.read_text() == f"intro\n{BEGIN}\nnew\n{END}\nafter\n"
    assert not replace_marked_section(path, BEGIN, END, f"{BEGIN}\nnew\n{END}")  # unchanged


def test_a_file_without_the_markers_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text("no markers\n")
    with pytest.raises(SystemExit) as stop:
        replace_marked_section(path, BEGIN, END, "x")
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert path.read_text() == "no markers\n"
