"""validation/heavy_lock.py: a launcher under an `flock` ancestor must not lock again."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "from validation import heavy_lock; heavy_lock.LOCK = {lock!r}; print(heavy_lock.lock_prefix())"


def _prefix(lock: Path, under_flock: bool) -> str:
    code = PROBE.format(lock=str(lock))
    command = (["flock", "-n", str(lock)] if under_flock else []) + [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_no_second_lock_under_an_flock_ancestor(tmp_path):
    lock = tmp_path / "heavy.lock"
    assert _prefix(lock, under_flock=True) == "[]"


def test_locks_when_no_ancestor_holds_it(tmp_path):
    lock = tmp_path / "heavy.lock"
    lock.touch()
    assert _prefix(lock, under_flock=False) == repr(["flock", str(lock)])
