"""The order `make test` hands test files to its three pytest-xdist workers (`--dist loadfile
--no-loadscope-reorder`; the wall times below were measured with two).

1. tests/runtime/test_straggler_replan.py first: its ranks sleep most of each pass (the emulated
   devices) and it asserts that the step time drops after its re-plan, which is fair only while the
   other worker's load stays about the same; its passes last five times their wall time, so four
   ranks of another launch beside them stretch them. Started last (xdist's own order, files with the
   most tests first), one worker idled about 90 s behind it; started beside a launch-line file it
   failed (both on fresh clones, 2026-11-29).
2. The files in tests/ itself: they plan and price in the pytest process or one CLI process at a
   time, about one core, so the straggler's ranks share the machine with a steady load.
3. The files whose launches take longest, longest first (their wall times in one `make test` from a
   fresh clone, same day: checkpoint safety 230 s, launch lines 218, equivalence 208, profiling 154,
   hybrid equivalence 104, hybrid checkpoints 87, MoE equivalence 76, then 58 down to 19 s), so that
   no long file starts near the end: with only the first seven placed, two files of about 55 s ran
   last and one worker finished 81 s after the other.
4. The rest of tests/runtime, files of 16 s or less, which even out the workers' ends.

A worker takes its next file when the one it runs has two tests or fewer left.
"""
from __future__ import annotations

FIRST = "runtime/test_straggler_replan.py"
LONGEST = ("runtime/test_checkpoint_safety.py", "runtime/test_launch_scripts.py", "runtime/test_equivalence.py",
           "runtime/test_profiling.py", "runtime/test_hybrid_equivalence.py", "runtime/test_hybrid_checkpoints.py",
           "runtime/test_moe_equivalence.py", "runtime/test_memory_fit.py", "runtime/test_run_semantics.py",
           "runtime/test_kernels_runtime.py", "runtime/test_pretrain_gpt.py", "runtime/test_megatron_lm_cases_run.py",
           "runtime/test_bad_runs.py", "runtime/test_model_flags_equivalence.py", "runtime/test_hybrid_pretrain.py",
           "runtime/test_recompute_modules.py")


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
