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


def block_seconds(run: Callable[[], object], iters: int, warmup: int = 1,
                  barrier: Callable[[], object] = lambda: None, repeats: int = 3,
                  untimed: Callable[[], object] | None = None) -> float:
    """Seconds per call of `iters` back-to-back calls, from one `barrier()` to the next, after
    `warmup` untimed ones: the pace of every rank running the same block at once (the median
    over `repeats` such blocks, against other load on the machine).

    With more ranks than cores the OS time-slices the processes, and a call
    shorter than a slice often runs whole inside one, so a per-call median
    reports the uncontended speed while the rank waits, unseen, between calls.
    A block that every rank starts together and that ends when the last rank
    is done counts that wait, as a synchronous training step does.

    `untimed` runs before every call and is left out of the time (a backward's
    forward): the block then counts the calls themselves and the wait at its
    closing barrier, so the time stays positive however loaded the machine is.
    """
    for _ in range(warmup):
        if untimed is not None:
            untimed()
        run()
    synchronize()
    blocks = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        skipped = 0.0
        for _ in range(iters):
            if untimed is not None:
                synchronize()
                skip_start = time.perf_counter()
                untimed()
                synchronize()
                skipped += time.perf_counter() - skip_start
            run()
        synchronize()
        barrier()
        blocks.append((time.perf_counter() - start - skipped) / iters)
    return statistics.median(blocks)
