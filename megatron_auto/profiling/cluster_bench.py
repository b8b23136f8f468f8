"""`profile-cluster`: collective time against message size, group size and rank stride.

Every rank of a torchrun job runs this. For each group shape (consecutive ranks
and ranks `world / n` apart, for n = 2, 4, ... up to the world) the world is
tiled into the disjoint groups of that shape, as Megatron's RankGenerator tiles
it into TP or DP groups, and every group runs the collective at once: in a
training step all TP (or DP) groups issue the same collective together, and
on a machine with fewer cores than ranks they share the cores. Each point is
timed as blocks of `iters` calls between two world barriers (timing.block_seconds,
as profile-model times layers), and in a block every rank runs a fixed chunk of
compute (`compute_between_s` of 256x256 matmuls, the same on every rank) before
each call, as a training step computes between two TP collectives: the
collective's time is (block of chunk + call) - (block of chunk alone), per call,
the median over blocks; the recorded time is the maximum over ranks (a
collective ends when its slowest rank does). On a CPU with fewer cores than
ranks this counts what a step pays and an idle benchmark does not: each
message round waits for the peer to be scheduled beside ranks that compute,
and partners reach the call out of step. Measured on 4 gloo ranks, 2 cores, a
256 KiB TP all-reduce inside the tp2 dp2 mbs2 validation step (collectives
timed in place) cost 22.5 ms per layer and micro-batch (two sync calls of
7.4 ms, two async ones waited on for 3.9 ms), against 4 x 5.8 = 23.1 ms from
this method, 4 x 2.8 ms from back-to-back blocks and 4 x ~1-4 ms from the
first method (per-call medians after a barrier, one group at a time).
NCCL on GPUs, gloo on CPU: the backend of the default group.
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .timing import block_seconds

logger = logging.getLogger(__name__)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class ClusterBenchConfig:
    """What to sweep."""

    message_bytes: tuple[int, ...]
    """Full-buffer sizes, ascending."""
    iters: int = 5
    """Calls per timed block (timing.block_seconds; median over `repeats` blocks)."""
    repeats: int = 3
    """Timed blocks per point."""
    compute_between_s: float = 0.005
    """Uncontended seconds of compute each rank runs before every timed call (0: calls back to
    back): about the work between two TP collectives of the 4-rank CPU validation job
    (2.5-10 ms there; on GPUs the chunk is queued work and changes little)."""
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


def tiled_groups(world: int, size: int, stride: int) -> list[list[int]]:
    """The disjoint groups of `size` ranks `stride` apart that cover the world, in rank order
    (Megatron-Core RankGenerator: a TP group is consecutive ranks, a DP group ranks `tp` apart)."""
    span = size * stride
    return [[base + offset + i * stride for i in range(size)]
            for base in range(0, world, span) for offset in range(stride)]


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


def compute_chunk(device, seconds: float) -> Callable[[], None]:
    """Repeated 256x256 matmuls lasting about `seconds` alone; the same count on every rank."""
    a = torch.randn(256, 256, device=device)
    one = block_seconds(lambda: a @ a, 20, barrier=dist.barrier)
    repeats = max(1, round(seconds / max(_max_over_world(one, device), 1e-9)))

    def chunk() -> None:
        for _ in range(repeats):
            a @ a

    return chunk


def time_collective(op: str, group, size: int, numel: int, config: ClusterBenchConfig, device,
                    chunk: Callable[[], None] | None = None) -> float:
    """Seconds per call of `op` on this rank's `group` of `size`, every group of the tiling at once
    (see the module docstring): blocks between world barriers, the maximum over ranks. With
    `chunk`, each repeat times a block of (chunk, call) pairs and a block of chunks alone, and
    the per-call time is the median over repeats of their difference (paired against drift in
    the machine's other load), or the call timed alone where that difference is not positive."""
    run = _collective(op, numel, size, group, device)
    if chunk is None:
        return _max_over_world(block_seconds(run, config.iters, barrier=dist.barrier, repeats=config.repeats),
                               device)
    differences = []
    for repeat in range(config.repeats):
        both = block_seconds(lambda: (chunk(), run()), config.iters, warmup=int(repeat == 0),
                             barrier=dist.barrier, repeats=1)
        alone = block_seconds(chunk, config.iters, warmup=0, barrier=dist.barrier, repeats=1)
        differences.append(both - alone)
    paired = _max_over_world(statistics.median(differences), device)
    if paired > 0:
        return paired
    # The machine's noise swamped a short call: its time alone is the better figure than none
    # (every rank sees the same `paired`, so all take this branch together).
    return time_collective(op, group, size, numel, config, device)


def time_p2p(peer_a: int, peer_b: int, numel: int, config: ClusterBenchConfig, device) -> float:
    """One-way seconds of a send from `peer_a` to `peer_b`: half a ping-pong's round trip,
    timed as blocks of back-to-back ping-pongs between world barriers (the others wait)."""
    rank = dist.get_rank()
    buffer = torch.ones(numel, device=device)

    def ping_pong() -> None:
        if rank == peer_a:
            dist.send(buffer, peer_b)
            dist.recv(buffer, peer_b)
        elif rank == peer_b:
            dist.recv(buffer, peer_a)
            dist.send(buffer, peer_a)

    mine = block_seconds(ping_pong, config.iters, barrier=dist.barrier, repeats=config.repeats) / 2
    return _max_over_world(mine if rank in (peer_a, peer_b) else 0.0, device)
