"""What the test workers report about their own process besides the training's numbers."""
from __future__ import annotations


def thread_count() -> int:
    """This process's operating-system threads (gloo's and torch's included), from /proc."""
    status = open("/proc/self/status").read()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
