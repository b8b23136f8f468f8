"""The order in which `make test`'s two pytest-xdist workers (-n 2 --dist loadfile) take the test files.

xdist hands a worker its next file when it finishes one, by default the files with the most tests first
(--loadscope-reorder), which left the longest multi-rank files, a few tests each, to the end: one worker ran
test_straggler_replan.py (about 200 s) and the launch lines alone while the other had nothing left. Here
test_straggler_replan.py goes first (its ranks sleep most of their passes, and its step times must drop after the re-plan: beside another file's multi-rank compute they did
not, 2026-11-29), beside the single-process files outside tests/runtime; then the files below, longest first
(seconds measured in one `make test` on two cores, 2026-11-29, each beside the other worker's files); then the
rest of tests/runtime as xdist would order them. Nothing else changes: every test runs, in
its file's own order, and a file's tests stay on one worker.
"""
from __future__ import annotations

LONGEST_FILES = {
    "tests/runtime/test_launch_scripts.py": 240,
    "tests/runtime/test_checkpoint_safety.py": 190,
    "tests/runtime/test_equivalence.py": 175,
    "tests/runtime/test_hybrid_equivalence.py": 95,
    "tests/runtime/test_moe_equivalence.py": 85,
    "tests/runtime/test_profiling.py": 75,
    "tests/runtime/test_pretrain_data.py": 56,
    "tests/runtime/test_pretrain_gpt.py": 55,
    "tests/runtime/test_kernels_runtime.py": 54,
    "tests/runtime/test_memory_fit.py": 54,
    "tests/runtime/test_megatron_lm_cases_run.py": 44,
}
FIRST = "tests/runtime/test_straggler_replan.py"


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order pytest_collection_modifyitems gives
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """FIRST, then the files outside tests/runtime, then LONGEST_FILES, longest first, then the rest; within each
    group most tests first (xdist's own order); a file's tests keep their order."""
    counts: dict[str, int] = {}
    for item in items:
        counts[_file(item)] = counts.get(_file(item), 0) + 1
    first_seen = {name: index for index, name in enumerate(counts)}
    items.sort(key=lambda item: (_group(_file(item)), -LONGEST_FILES.get(_file(item), 0), -counts[_file(item)],
                                 first_seen[_file(item)]))


def _group(name: str) -> int:
    return 0 if name == FIRST else 1 if not name.startswith("tests/runtime/") else 2


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]
