"""Node speeds as the straggler watch (runtime/stragglers.py) and `profile-cluster` (profiling/node_speeds.py)
measure them (issue 39): the step they are rounded to, and the test-only switch that slows one rank.

A speed is a share of the cost model's pace, in (0, 1]; planning takes it through specs.presets.with_node_speeds.
`MEGATRON_AUTO_SLOW_RANK=RANK:FACTOR[:BASE]` makes every rank's timed work last BASE times its compute (its CPU
seconds: emulated_pass_end) and RANK's FACTOR times that (the rest asleep, as a GPU leaves its host
idle), on CPU only: the straggler tests and
benchmarks use it, as the injected out-of-memory serves the memory tests.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch

SLOW_ENV = "MEGATRON_AUTO_SLOW_RANK"
SPEED_STEP = 0.05
"""Measured speeds are rounded to this step, so that timing noise does not make new plans."""


def emulated_slowdown(rank: int, environ=os.environ) -> Optional[float]:
    """How many times its own compute time each of this rank's timed passes lasts under `MEGATRON_AUTO_SLOW_RANK`;
    None where the switch is off, and always on CUDA."""
    text = environ.get(SLOW_ENV)
    if not text or torch.cuda.is_available():
        return None
    parts = text.split(":")
    base = float(parts[2]) if len(parts) > 2 else 1.0
    return base * (float(parts[1]) if int(parts[0]) == rank else 1.0)


def injected_slowdown(rank: int, environ=os.environ) -> float:
    """emulated_slowdown, 1.0 (as long as it computes) where the switch is off."""
    slowdown = emulated_slowdown(rank, environ)
    return 1.0 if slowdown is None else slowdown


def emulated_pass_end(started_s: float, started_cpu_s: float, slowdown: float, clock=time) -> float:
    """End a pass that began at `clock.perf_counter()` `started_s` and `clock.thread_time()` `started_cpu_s` as the
    switch's emulated device would: it lasts `slowdown` times this thread's CPU seconds since (the rank runs one
    intra-op thread, OMP_NUM_THREADS=1 as torchrun sets it), asleep for what the compute did not take. The
    processes that share the rank's cores do not lengthen it, as a busy host does not slow a GPU's kernels.
    Returns the pass's emulated seconds."""
    device_s = slowdown * (clock.thread_time() - started_cpu_s)
    clock.sleep(max(0.0, device_s - (clock.perf_counter() - started_s)))
    return device_s


def rounded_speed(speed: float) -> float:
    """A speed in (0, 1] in SPEED_STEP steps."""
    return min(1.0, max(SPEED_STEP, round(round(speed / SPEED_STEP) * SPEED_STEP, 6)))
