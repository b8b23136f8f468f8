"""Timing helpers shared by the cluster and model profilers."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def synchronize() -> None:
    """Wait for queued device work (a no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_seconds(run: Callable[[], object], iters: int, warmup: int = 1,
                   before: Callable[[], object] | None = None) -> float:
    """Median wall-clock seconds of `run()` over `iters` calls after `warmup` untimed calls.

    `before` runs untimed ahead of every call (e.g. a barrier, or zeroing gradients).
    """
    for _ in range(warmup):
        if before is not None:
            before()
        run()
    synchronize()
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
