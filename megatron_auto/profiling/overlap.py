"""How much of an all-reduce the machine hides behind concurrent compute.

Each rank times an all-reduce alone (T_a), a matmul loop alone (T_c) and both
at once (async all-reduce issued, the loop run, then waited on: T_b). The
hidden share is (T_a + T_c - T_b) / min(T_a, T_c), clipped to [0, 1] and
averaged over ranks. On GPUs NCCL runs on its own stream and hides most of it;
on an oversubscribed CPU the gloo threads compete with the compute for cores.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .timing import median_seconds, synchronize


def _matmul_loop(device, seconds_target: float) -> callable:
    """A closure of repeated 256x256 matmuls lasting about `seconds_target`."""
    a = torch.randn(256, 256, device=device)
    start = time.perf_counter()
    a @ a
    synchronize()
    one = max(time.perf_counter() - start, 1e-6)
    repeats = max(1, int(seconds_target / one))

    def loop() -> None:
        for _ in range(repeats):
            a @ a

    return loop


def grad_overlap_fraction(device, numel: int, iters: int = 3) -> float:
    """Mean over ranks of the share of an all-reduce hidden behind compute."""
    buffer = torch.ones(numel, device=device)
    dist.barrier()
    t_a = median_seconds(lambda: dist.all_reduce(buffer), iters, before=dist.barrier)
    loop = _matmul_loop(device, t_a)
    t_c = median_seconds(loop, iters, before=dist.barrier)

    def both() -> None:
        work = dist.all_reduce(buffer, async_op=True)
        loop()
        work.wait()

    t_b = median_seconds(both, iters, before=dist.barrier)
    hidden = (t_a + t_c - t_b) / max(min(t_a, t_c), 1e-9)
    share = torch.tensor([min(max(hidden, 0.0), 1.0)], dtype=torch.float64, device=device)
    dist.all_reduce(share)
    return float(share.item()) / dist.get_world_size()
