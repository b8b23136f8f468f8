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

FORWARD, BACKWARD = "F", "B"


def pipeline_time(stage_times: Sequence[float], num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Seconds for all micro-batches to pass forward and backward through all stages."""
    slowest = max(stage_times)
    fill_and_drain = (sum(stage_times) - slowest) / virtual_stages
    return num_micro_batches * slowest + fill_and_drain


def bubble_time(stage_times: Sequence[float], num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle seconds of the slowest stage: the schedule's time beyond m x T_max."""
    return pipeline_time(stage_times, num_micro_batches, virtual_stages) - num_micro_batches * max(stage_times)


def exposed_dp_time(dp_comm_s: float, backward_s: float, overlap: float = 1.0, interference: float = 0.0) -> float:
    """Gradient traffic of one layer left over after its overlap with backward.

    Megatron-Core's DDP (overlap_grad_reduce) reduces each layer's bucket while
    the backward of the layers below it runs; for a stack of like layers that
    window is one layer's backward per bucket. The bucket finished last (the
    stage's first unit) has no window: callers charge it in full. `overlap` is the
    share of the window the machine really hides (1: all of it; a cluster profile's
    measured `grad_overlap_fraction` otherwise). `interference`: the share of the hidden traffic's time that the
    backward beside it loses to the collective's SMs (cost/comm_interference.py), charged on top.
    """
    return dp_comm_s - overlap * min(dp_comm_s, backward_s) * (1.0 - interference)


def exposed_dp_split(dp_comm_s: float, gather_s: float, backward_s: float, forward_s: float, overlap: float = 1.0,
                     interference: float = 0.0) -> float:
    """exposed_dp_time of one layer whose `dp_comm_s` holds `gather_s` of weight all-gather: the gradients' part
    beside its backward, the all-gather beside its forward (--overlap-param-gather: communication.dp_comm_times)."""
    return (exposed_dp_time(dp_comm_s - gather_s, backward_s, overlap, interference)
            + exposed_dp_time(gather_s, forward_s, overlap, interference))


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


def schedule_order(stages: int, micro_batches: int, chunks: int, stage: int,
                   schedule: str = "1f1b") -> list[tuple[str, int, int]]:
    """(kind, chunk, micro-batch) in the order stage `stage` runs them."""
    total = micro_batches * chunks
    warmup = total if schedule == "gpipe" else min(warmup_chunk_forwards(stages, chunks, stage), total)
    forwards = [_virtual(k, stages, chunks, True) for k in range(total)]
    backwards = [_virtual(k, stages, chunks, False) for k in range(total)]
    order = [(FORWARD, *f) for f in forwards[:warmup]]
    for index in range(total - warmup):
        order += [(FORWARD, *forwards[warmup + index]), (BACKWARD, *backwards[index])]
    return order + [(BACKWARD, *b) for b in backwards[total - warmup:]]


def _virtual(k: int, stages: int, chunks: int, forward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of a stage's k-th chunk forward or backward (Megatron-Core's
    get_model_chunk_id: micro-batches in groups of p, chunk by chunk)."""
    if chunks == 1:
        return 0, k
    in_group = k % (stages * chunks)
    chunk = in_group // stages
    micro_batch = (k // (stages * chunks)) * stages + in_group % stages
    return (chunk if forward else chunks - 1 - chunk), micro_batch


def dependency(kind: str, chunk: int, micro_batch: int, stage: int, stages: int,
               chunks: int) -> tuple[str, int, int, int] | None:
    """The operation (kind, chunk, micro-batch, stage) that must finish first, if any."""
    if kind == FORWARD:
        if stage > 0:
            return FORWARD, chunk, micro_batch, stage - 1
        return (FORWARD, chunk - 1, micro_batch, stages - 1) if chunk > 0 else None
    if stage < stages - 1:
        return BACKWARD, chunk, micro_batch, stage + 1
    if chunk < chunks - 1:
        return BACKWARD, chunk + 1, micro_batch, 0
    return FORWARD, chunk, micro_batch, stage


def chunked_pipeline_time(chunk_times: Sequence[Sequence[tuple[float, float]]], num_micro_batches: int,
                          tails: Sequence[float] = (), schedule: str = "1f1b", hop_s: float = 0.0) -> float:
    """Seconds of an iteration whose chunks differ: Megatron-Core's schedule replayed operation by operation
    (`schedule_order`, `dependency`), each stage running its chunk forwards and backwards in its order, each as
    soon as the stage is free and what it needs has finished, then its tail (`tails`: exposed gradient sync and
    optimizer step). `chunk_times[s][c]`: (forward, backward) seconds of one micro-batch through chunk c of stage
    s, the p2p each sends included. With equal chunks this is `pipeline_time` (tests/test_chunked_pipeline.py).
    `hop_s`: a transfer's latency between stages that does not hold up its sender (overlap_p2p_comm): an operation
    that needs another stage's result starts `hop_s` after it."""
    stages, chunks = len(chunk_times), len(chunk_times[0])
    orders = [schedule_order(stages, num_micro_batches, chunks, s, schedule) for s in range(stages)]
    position, free = [0] * stages, [0.0] * stages
    finished: dict[tuple[str, int, int, int], float] = {}
    while True:
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, chunk, micro_batch = orders[s][position[s]]
                needed = dependency(kind, chunk, micro_batch, s, stages, chunks)
                if needed is not None and needed not in finished:
                    break
                ready = 0.0 if needed is None else finished[needed] + (hop_s if needed[3] != s else 0.0)
                start = max(free[s], ready)
                free[s] = start + chunk_times[s][chunk][0 if kind == FORWARD else 1]
                finished[(kind, chunk, micro_batch, s)] = free[s]
                position[s], progressed = position[s] + 1, True
        if all(p == len(order) for p, order in zip(position, orders)):
            return max(f + (tails[s] if tails else 0.0) for s, f in enumerate(free))
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug in the order, never the input
