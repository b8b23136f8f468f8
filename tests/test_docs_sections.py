"""benchmarks/docs_sections.py: the benchmark tools replace only their own section of docs/benchmarks.md."""
from pathlib import Path

from benchmarks.docs_sections import replace_section

DOC = "# Benchmarks\n\n## First\nold\n\n## Second\nkept\n"


def test_replaces_only_the_named_section():
    assert replace_section(DOC, "## First", "## First\nnew\n\n") == "# Benchmarks\n\n## First\nnew\n\n## Second\nkept\n"


def test_last_section_and_missing_heading():
    assert replace_section(DOC, "## Second", "## Second\nnew\n").endswith("## First\nold\n\n## Second\nnew\n")
    assert replace_section(DOC, "## Third", "## Third\nx\n").endswith("## Second\nkept\n\n## Third\nx\n")


def test_write_section_creates_the_file_and_ends_it_in_one_newline(tmp_path):
    from benchmarks.docs_sections import write_section

    path = tmp_path / "benchmarks.md"
    write_section(path, "## First", "## First\nnew\n\n\n")
    assert path.read_text() == "# Benchmarks\n\n## First\nnew\n"
    write_section(path, "## Second", "## Second\nx\n")
    write_section(path, "## First", "## First\nnewer\n\n")
    assert path.read_text() == "# Benchmarks\n\n## First\nnewer\n\n## Second\nx\n"


def test_publish_writes_the_section_and_prints_it_unless_told_not_to(tmp_path, monkeypatch, capsys):
    import argparse

    from benchmarks import docs_sections

    path = tmp_path / "benchmarks.md"
    monkeypatch.setattr(docs_sections, "BENCHMARKS_MD", path)
    docs_sections.publish("## First", "## First\nnew\n", no_docs=True)
    assert capsys.readouterr().out == "## First\nnew\n" and not path.exists()
    docs_sections.publish("## First", "## First\nnew\n", no_docs=False)
    assert path.read_text() == "# Benchmarks\n\n## First\nnew\n"
    parser = argparse.ArgumentParser()
    docs_sections.add_ab_arguments(parser, launches=2)
    args = parser.parse_args(["--no-docs"])
    assert (args.blocks, args.launches, args.no_docs) == (300, 2, True)
