"""Each node's GEMM speed, measured by every rank of a `profile-cluster` job (issue 39: a throttled GPU, a slow
node). Every rank times one square matmul (the fastest of a few runs, so that a moment's contention does not
count); the ranks all-gather their seconds and node ranks; a node's speed is the job's reference seconds over its
slowest rank's. The reference is the median of the faster half of the ranks, so that one slow node of two does not
drag it halfway (the straggler watch, with its many ranks per stage, takes the plain median). Nodes within NOISE of
the reference run at 1; the rest are rounded to runtime.node_speed.SPEED_STEP. `plan --profile FILE` then plans
for those speeds (specs.presets.with_node_speeds), as `--node-speeds` does.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..runtime.node_speed import emulated_pass_end, emulated_slowdown, rounded_speed

NOISE = 0.1
"""Nodes this close to the reference speed count as healthy (1.0)."""
REPEATS = 16


def node_speeds(seconds: Sequence[float], node_of_rank: Sequence[int]) -> tuple[float, ...]:
    """Per node (node-rank order): the reference seconds over its slowest rank's (module docstring)."""
    faster = sorted(seconds)[:max(1, (len(seconds) + 1) // 2)]
    reference = statistics.median(faster)
    speeds = []
    for node in range(max(node_of_rank) + 1):
        worst = max(s for s, owner in zip(seconds, node_of_rank) if owner == node)
        speed = reference / worst
        speeds.append(1.0 if speed >= 1.0 - NOISE else rounded_speed(speed))
    return tuple(speeds)


def matmul_seconds(device: torch.device, size: int, dtype: torch.dtype, slowdown: Optional[float] = None) -> float:
    """The fastest of REPEATS runs of one size x size matmul on `device`. `slowdown`: under the test-only switch,
    each run lasts that many times its CPU seconds, asleep for the rest (runtime.node_speed.emulated_pass_end), so
    that the other processes on the cores move no rank's time."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started, started_cpu = time.perf_counter(), time.thread_time()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if slowdown is None:
            best = min(best, time.perf_counter() - started)
        else:
            best = min(best, emulated_pass_end(started, started_cpu, slowdown, time))
    return best


def measure_node_speeds(device: torch.device) -> tuple[float, ...]:
    """Every rank's matmul seconds and node rank (torchrun's GROUP_RANK), all-gathered: each node's speed."""
    rank = dist.get_rank()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(dist.get_world_size())))
    node = int(os.environ.get("GROUP_RANK", str(rank // per_node)))
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (768, torch.float32)
    mine = torch.tensor([matmul_seconds(device, size, dtype, emulated_slowdown(rank)), float(node)],
                        dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return node_speeds([float(t[0]) for t in every], [int(t[1]) for t in every])
