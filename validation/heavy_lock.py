"""The shared heavy-job lock, taken once per launch unless an ancestor already holds it.

Heavy launches here run as `flock /tmp/megatron-auto-heavy.lock <command>`.
flock(1) keeps the lock on a file descriptor that its command inherits; a
nested `flock` opens the file anew and waits for a lock its own ancestor holds,
forever. So a launcher first looks for an inherited descriptor of the lock file
(`held_lock_fds`) and, when it finds one, runs its command without `flock` and
passes the descriptor on (`subprocess.run(..., pass_fds=held_lock_fds())`).
"""
from __future__ import annotations

import os

LOCK = "/tmp/megatron-auto-heavy.lock"


def held_lock_fds() -> tuple[int, ...]:
    """Descriptors of this process that refer to the lock file (inherited from an `flock` ancestor)."""
    found = []
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            if os.readlink(f"/proc/self/fd/{name}") == LOCK:
                found.append(int(name))
        except OSError:  # the descriptor listdir itself used, already closed
            continue
    return tuple(sorted(found))


def lock_prefix() -> list[str]:
    """`["flock", LOCK]`, or nothing when an ancestor holds the lock already."""
    return [] if held_lock_fds() else ["flock", LOCK]


def hold_lock_or_relaunch(python: str, argv: list[str]) -> None:
    """Return when this process holds the lock (inherited); otherwise replace it by itself under `flock`."""
    if not held_lock_fds():
        os.execvp("flock", ["flock", LOCK, python, *argv])
