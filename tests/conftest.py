"""The order `make test` hands test files to its two pytest-xdist workers (`--dist loadfile
--no-loadscope-reorder`).

1. tests/runtime/test_straggler_replan.py first: its ranks sleep most of each pass (the emulated
   devices) and it asserts that the step time drops after its re-plan, which is fair only while the
   other worker's load stays about the same; its passes last five times their wall time, so four
   ranks of another launch beside them stretch them. Started last (xdist's own order, files with the
   most tests first), one worker idled about 90 s behind it; started beside a launch-line file it
   failed (both on fresh clones, 2026-11-29).
2. The files in tests/ itself: they plan and price in the pytest process or one CLI process at a
   time, about one core, so the straggler's ranks share the machine with a steady load.
3. The files whose launches take longest, longest first (one `make test`, same day: launch lines
   176 s, checkpoint safety 170, equivalence 160, hybrid equivalence 96, profiling 92, MoE equivalence
   77, hybrid checkpoints 62; no other file over 55), so that no long file starts near the end.
4. The rest of tests/runtime, short files that even out the two workers' ends.

A worker takes its next file when the one it runs has two tests or fewer left.
"""
from __future__ import annotations

FIRST = "runtime/test_straggler_replan.py"
LONGEST = ("runtime/test_launch_scripts.py", "runtime/test_checkpoint_safety.py", "runtime/test_equivalence.py",
           "runtime/test_hybrid_equivalence.py", "runtime/test_profiling.py", "runtime/test_moe_equivalence.py",
           "runtime/test_hybrid_checkpoints.py")


def file_rank(nodeid: str) -> int:
    """Where a test's file goes in the order above (lower first)."""
    path = nodeid.split("::", 1)[0]
    if path.endswith(FIRST):
        return 0
    if "/runtime/" not in path:
        return 1
    for rank, name in enumerate(LONGEST):
        if path.endswith(name):
            return 2 + rank
    return 2 + len(LONGEST)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: file_rank(item.nodeid))  # stable: collection order within a rank
