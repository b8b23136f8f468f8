"""Pipeline schedule time from per-stage micro-batch times.

For balanced stages of time T, 1F1B and GPipe take (m + p - 1) T and the
interleaved schedule (m + (p - 1) / v) T (Narayanan et al. SC21, Sec. 2.2:
bubble fraction (p - 1) / m, reduced v-fold by interleaving). For unequal stages
the steady state runs at the slowest stage and the fill and drain walk every
stage once: m T_max + (sum T - T_max) / v (Galvatron-BMW's pipeline cost, with
SC21's 1/v for interleaving).
"""
from __future__ import annotations

from typing import Sequence


def pipeline_time(stage_times: Sequence[float], num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Seconds for all micro-batches to pass forward and backward through all stages."""
    slowest = max(stage_times)
    fill_and_drain = (sum(stage_times) - slowest) / virtual_stages
    return num_micro_batches * slowest + fill_and_drain


def bubble_time(stage_times: Sequence[float], num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle seconds of the slowest stage: the schedule's time beyond m x T_max."""
    return pipeline_time(stage_times, num_micro_batches, virtual_stages) - num_micro_batches * max(stage_times)


def exposed_dp_time(dp_comm_s: float, backward_s: float, overlap: float = 1.0) -> float:
    """Gradient traffic of one layer left over after its overlap with backward.

    Megatron-Core's DDP (overlap_grad_reduce) reduces each layer's bucket while
    the backward of the layers below it runs; for a stack of like layers that
    window is one layer's backward per bucket. The bucket finished last (the
    stage's first unit) has no window: callers charge it in full. `overlap` is the
    share of the window the machine really hides (1: all of it; a cluster profile's
    measured `grad_overlap_fraction` otherwise).
    """
    return dp_comm_s - overlap * min(dp_comm_s, backward_s)


def exposed_p2p_time(p2p_s: float, chunk_compute_s: float, virtual_stages: int, overlap: float = 1.0) -> float:
    """One chunk boundary's sends and receives left after overlapping with compute.

    With virtual stages Megatron-LM turns on --overlap-p2p-communication (arguments.py: on by default with
    the interleaved schedule): Megatron-Core's interleaved schedule posts each chunk's sends and receives
    asynchronously and waits for them only before the chunk that needs them, so they run beside the next
    chunk's forward and backward (pipeline_parallel/schedules.py, overlap_p2p_comm). The plain 1F1B schedule
    waits on each. `overlap`: the share the machine hides (CommModel.grad_overlap: 0 on cpu-gloo)."""
    if virtual_stages == 1:
        return p2p_s
    return p2p_s - overlap * min(p2p_s, chunk_compute_s)


def warmup_chunk_forwards(stages: int, chunks: int, stage: int) -> int:
    """Chunk forwards stage `stage` runs before its first backward under 1F1B, before
    capping at the m x v it has: p - s - 1, or (p - s - 1) 2 + (v - 1) p when interleaved
    (Megatron-Core pipeline_parallel/schedules.py)."""
    if chunks == 1:
        return stages - stage - 1
    return (stages - stage - 1) * 2 + (chunks - 1) * stages
