"""`profile-cluster`: collective time against message size, group size and rank stride.

Every rank of a torchrun job runs this. For each group shape (consecutive ranks
and ranks `world / n` apart, for n = 2, 4, ... up to the world) and each op, the
group's ranks time the collective (median of `iters` after a warmup, each call
after a barrier of the group) while the other ranks wait; the recorded time is
the maximum of the members' medians (the collective ends when its slowest rank
does). NCCL on GPUs, gloo on CPU: the backend of the default group.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .timing import median_seconds

logger = logging.getLogger(__name__)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class ClusterBenchConfig:
    """What to sweep."""

    message_bytes: tuple[int, ...]
    """Full-buffer sizes, ascending."""
    iters: int = 5
    """Timed calls per point (median)."""
    name: str = "measured"
    """Label written into the profile."""


def group_shapes(world: int) -> list[tuple[int, int]]:
    """(group size, stride) pairs: consecutive and, where different, strided groups."""
    shapes = []
    size = 2
    while size <= world:
        shapes.append((size, 1))
        stride = world // size
        if stride > 1:
            shapes.append((size, stride))
        size *= 2
    return shapes


def _collective(op: str, numel: int, size: int, group, device) -> Callable[[], object]:
    """A closure that runs `op` on a buffer of `numel` float32 elements (the full buffer)."""
    numel = max(size, numel - numel % size)
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // size, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":  # torch >= 2.13 renames these *_single
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: gather(full, shard, group=group)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: scatter(shard, full, group=group)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full, group=group)


def _max_over_world(value: float, device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def time_collective(op: str, ranks: list[int], group, numel: int, iters: int, device) -> float:
    """Seconds of `op` over `ranks`, the max over its members' medians (0 on non-members)."""
    mine = 0.0
    if dist.get_rank() in ranks:
        run = _collective(op, numel, len(ranks), group, device)
        mine = median_seconds(run, iters, before=lambda: dist.barrier(group=group))
    return _max_over_world(mine, device)


def time_p2p(peer_a: int, peer_b: int, numel: int, iters: int, device) -> float:
    """One-way seconds of a send from `peer_a` to `peer_b`: half a ping-pong's round trip."""
    rank = dist.get_rank()
    buffer = torch.ones(numel, device=device)

    def ping_pong() -> None:
        if rank == peer_a:
            dist.send(buffer, peer_b)
            dist.recv(buffer, peer_b)
        elif rank == peer_b:
            dist.recv(buffer, peer_a)
            dist.send(buffer, peer_a)

    mine = median_seconds(ping_pong, iters) / 2 if rank in (peer_a, peer_b) else 0.0
    return _max_over_world(mine, device)
