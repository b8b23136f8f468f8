"""What the test workers report about their own process besides the training's numbers."""
from __future__ import annotations

import os


def thread_count() -> int:
    """This process's operating-system threads (gloo's and torch's included), from /proc."""
    status = open("/proc/self/status").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


GLOO_GROUP_THREADS = 3
"""Threads one gloo process group holds while alive (torch 2.13: two workers and its transport loop)."""


def thread_bound(counts: list[int]) -> int:
    """The most threads a case may end with, derived from `counts` (one per case, in the order they ran): what
    the first case ended with, plus a slack below one gloo group's threads, so that a case leaving even a
    single group alive fails the bound."""
    return counts[0] + GLOO_GROUP_THREADS - 1


GROUP_THREAD_NAMES = ("gloo_", "pt_gloo", "pt_tcpstore")
"""Name prefixes of the threads process groups and their stores run (gloo's transport loops and workers)."""


def group_thread_count() -> int:
    """This process's threads that belong to process groups and stores (by their names, from /proc): a leaked
    group shows here, and a pool a kernel library starts once (torch.compile's workers) does not."""
    names = (open(f"/proc/self/task/{task}/comm").read() for task in os.listdir("/proc/self/task"))
    return sum(name.startswith(GROUP_THREAD_NAMES) for name in names)
