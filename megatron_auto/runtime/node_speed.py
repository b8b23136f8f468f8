"""Node speeds as the straggler watch (runtime/stragglers.py) and `profile-cluster` (profiling/node_speeds.py)
measure them (issue 39): the step they are rounded to, and the test-only switch that slows one rank.

A speed is a share of the cost model's pace, in (0, 1]; planning takes it through specs.presets.with_node_speeds.
`MEGATRON_AUTO_SLOW_RANK=RANK:FACTOR[:BASE]` makes every rank's timed work last BASE times its compute (its CPU
seconds in the straggler watch's clock) and RANK's FACTOR times that (the rest asleep, as a GPU leaves its host
idle), on CPU only: the straggler tests and
benchmarks use it, as the injected out-of-memory serves the memory tests.
"""
from __future__ import annotations

import os

import torch

SLOW_ENV = "MEGATRON_AUTO_SLOW_RANK"
SPEED_STEP = 0.05
"""Measured speeds are rounded to this step, so that timing noise does not make new plans."""


def injected_slowdown(rank: int, environ=os.environ) -> float:
    """How many times its own compute time each of this rank's timed passes lasts under `MEGATRON_AUTO_SLOW_RANK`
    (1.0: as long as it computes, and always on CUDA)."""
    text = environ.get(SLOW_ENV)
    if not text or torch.cuda.is_available():
        return 1.0
    parts = text.split(":")
    base = float(parts[2]) if len(parts) > 2 else 1.0
    return base * (float(parts[1]) if int(parts[0]) == rank else 1.0)


def rounded_speed(speed: float) -> float:
    """A speed in (0, 1] in SPEED_STEP steps."""
    return min(1.0, max(SPEED_STEP, round(round(speed / SPEED_STEP) * SPEED_STEP, 6)))
