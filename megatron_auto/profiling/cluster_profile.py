"""Run the cluster sweep on every rank and assemble a ClusterProfile (rank 0 keeps it)."""
from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..specs.profiles import ClusterProfile, CollectiveCurve
from .cluster_bench import (OPS, ClusterBenchConfig, compute_chunk, group_shapes, tiled_groups, time_collective,
                            time_p2p)
from .node_speeds import measure_node_speeds
from .overlap import grad_overlap_fraction

logger = logging.getLogger(__name__)
FLOAT_BYTES = 4


def init_from_env(timeout_s: float = 600.0) -> tuple[torch.device, str]:
    """Join the torchrun job: NCCL on the local GPU, or gloo on the CPU."""
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        dist.init_process_group(backend, rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                                timeout=timedelta(seconds=timeout_s))
    return device, backend


def _groups(world: int, per_node: int) -> list[tuple[int, int, object, bool]]:
    """(size, stride, this rank's group, inter_node) for each shape, the world tiled into the
    shape's groups (cluster_bench.tiled_groups); every rank creates every group (new_group's rule)."""
    rank, out = dist.get_rank(), []
    for size, stride in group_shapes(world):
        mine = None
        for ranks in tiled_groups(world, size, stride):
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
        inter = any(ranks[-1] // per_node != ranks[0] // per_node for ranks in tiled_groups(world, size, stride))
        out.append((size, stride, mine, inter))
    return out


def _p2p_pairs(world: int, per_node: int) -> list[tuple[int, int, bool]]:
    """Neighbouring ranks, and rank 0 with the first rank of the next node (when there is one)."""
    pairs = [(0, 1, per_node < 2)] if world > 1 else []
    if world > per_node:
        pairs.append((0, per_node, True))
    return pairs


def profile_cluster(config: ClusterBenchConfig, progress: Optional[Callable[[float], None]] = None) -> ClusterProfile:
    """Sweep every op, group shape and message size; returns the same profile on every rank."""
    device, backend = init_from_env()
    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    groups = _groups(world, per_node)
    pairs = _p2p_pairs(world, per_node)
    total = (len(groups) * len(OPS) + len(pairs)) * len(config.message_bytes) + 1
    chunk = compute_chunk(device, config.compute_between_s) if config.compute_between_s > 0 else None
    done = 0
    curves = []
    for size, stride, group, inter in groups:
        for op in OPS:
            seconds = []
            for nbytes in config.message_bytes:
                seconds.append(time_collective(op, group, size, nbytes // FLOAT_BYTES, config, device, chunk))
                done += 1
                if progress:
                    progress(done / total)
            curves.append(CollectiveCurve(op, size, stride, inter, tuple(config.message_bytes), tuple(seconds)))
    for a, b, inter in pairs:
        seconds = []
        for nbytes in config.message_bytes:
            seconds.append(time_p2p(a, b, nbytes // FLOAT_BYTES, config, device))
            done += 1
            if progress:
                progress(done / total)
        curves.append(CollectiveCurve("p2p", 2, b - a, inter, tuple(config.message_bytes), tuple(seconds)))
    overlap = grad_overlap_fraction(device, max(config.message_bytes) // FLOAT_BYTES)
    speeds = measure_node_speeds(device)
    if progress:
        progress(1.0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ClusterProfile(name=config.name, backend=backend, device=name, world_size=world,
                          gpus_per_node=per_node, curves=tuple(curves), grad_overlap_fraction=overlap,
                          node_speeds=speeds)
