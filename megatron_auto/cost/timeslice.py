"""Ranks that outnumber the CPU cores: the pipeline schedule simulated under processor sharing.

The layer profile timed each layer with every process busy, each at `share` (cores /
processes) of a core. In a real step a rank that waits, in a collective or for a
neighbouring pipeline stage, gives its core to the others, so the step is shorter
than the profiled compute plus the waiting. This module replays the schedule, one
operation (a micro-batch chunk's forward or backward, the gradient sync, the
optimizer step) at a time per stage, and between events shares the cores:

- the ranks of one TP group compute and wait together (every layer synchronises them);
- the stage's DP replicas are independent until the gradient sync, each busy a fraction
  f = x / (x + T) of its operation (x: its compute wall time, T: its waiting), the
  mean-field assumption of processor sharing (Kleinrock, JACM 1967);
- a computing rank then gets min(1, C / load) of a core, load = its group + the other
  busy ranks of every running stage, so x = W max(1, load / C) for W seconds of work at a
  whole core, solved as a fixed point.

A stage that waits on another stage's operation (the fill and drain of the pipeline)
uses no core, so the stages that run meanwhile go faster: the bubble is partly
filled, which the sum of the stage times cannot show. The operation order is
Megatron-Core's (pipeline_parallel/schedules.py): 1F1B with (p - s - 1) warm-up
forwards, its interleaved form with (p - s - 1) 2 + (v - 1) p warm-up chunk forwards
and micro-batches taken p at a time, or GPipe (all forwards, then all backwards).
"""
from __future__ import annotations

from dataclasses import dataclass

from .pipeline import BACKWARD, FORWARD, dependency, schedule_order

SYNC, STEP = "sync", "step"


@dataclass(frozen=True)
class StageLoad:
    """One pipeline stage's operations: (work at a whole core, waiting) seconds each."""

    group: int
    """Ranks of one TP group (they compute and wait together)."""
    replicas: int
    """Independent TP groups in the stage (its DP degree)."""
    forward: tuple[float, float]
    """One micro-batch through one of the stage's chunks, forward."""
    backward: tuple[float, float]
    """The same, backward (with any recomputation)."""
    sync: float
    """Per iteration: the exposed gradient sync (waiting only)."""
    step_work: float
    """Per iteration: the optimizer step and the runtime's per-step work."""
    chunk_weights: tuple[float, ...] = ()
    """Each chunk's operations as a multiple of `forward` and `backward` (which are the stage's per-chunk mean);
    empty: every chunk alike."""


def shared_compute_times(running: dict[int, tuple[float, float]], loads: list[StageLoad],
                         cores: int) -> dict[int, float]:
    """Compute wall time x of each running stage's operation (work W, waiting T) while those
    stages share `cores`: the fixed point of x = W max(1, load / C) (module docstring)."""
    busy = {s: (1.0 if work > 0 else 0.0) for s, (work, _) in running.items()}
    compute = {s: work for s, (work, _) in running.items()}
    for _ in range(200):
        others = sum(loads[s].group * loads[s].replicas * busy[s] for s in running)
        moved = 0.0
        for s, (work, wait) in running.items():
            load = others - loads[s].group * busy[s] + loads[s].group
            compute[s] = work * max(1.0, load / cores)
            fraction = compute[s] / (compute[s] + wait) if compute[s] + wait > 0 else 0.0
            moved, busy[s] = max(moved, abs(fraction - busy[s])), fraction
        if moved < 1e-12:
            break
    return compute


def simulate_iteration(loads: list[StageLoad], micro_batches: int, chunks: int, cores: int,
                       schedule: str = "1f1b") -> float:
    """Seconds of one iteration: every stage's schedule, its gradient sync and its step."""
    stages = len(loads)
    orders = [schedule_order(stages, micro_batches, chunks, s, schedule) + [(SYNC, 0, 0), (STEP, 0, 0)]
              for s in range(stages)]
    position, left = [0] * stages, [0.0] * stages
    weighted = any(load.chunk_weights for load in loads)
    finished: set[tuple[str, int, int, int]] = set()
    durations: dict[tuple[tuple[int, str, int], ...], dict[int, float]] = {}
    now = 0.0
    while any(p < len(order) for p, order in zip(position, orders)):
        for s in range(stages):
            if left[s] == 0.0 and position[s] < len(orders[s]):
                kind, chunk, micro_batch = orders[s][position[s]]
                needed = dependency(kind, chunk, micro_batch, s, stages, chunks) if kind in (FORWARD, BACKWARD) else None
                left[s] = 1.0 if needed is None or needed in finished else 0.0
        kinds = tuple((s, orders[s][position[s]][0], orders[s][position[s]][1] if weighted else 0)
                      for s in range(stages) if left[s] > 0)
        if not kinds:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug in the order, never the input
        if kinds not in durations:  # few distinct sets of running operations recur all along
            running = {s: _operation(loads[s], kind, chunk) for s, kind, chunk in kinds}
            compute = shared_compute_times(running, loads, cores)
            durations[kinds] = {s: compute[s] + running[s][1] for s in running}
        duration = durations[kinds]
        step = min(left[s] * duration[s] for s in duration)
        now += step
        for s in duration:
            left[s] = 0.0 if duration[s] == 0 else max(0.0, left[s] - step / duration[s])
            if left[s] <= 1e-12:
                kind, chunk, micro_batch = orders[s][position[s]]
                finished.add((kind, chunk, micro_batch, s))
                position[s], left[s] = position[s] + 1, 0.0
    return now


def _operation(load: StageLoad, kind: str, chunk: int) -> tuple[float, float]:
    weight = load.chunk_weights[chunk] if load.chunk_weights and kind in (FORWARD, BACKWARD) else 1.0
    if kind == FORWARD:
        return load.forward[0] * weight, load.forward[1] * weight
    if kind == BACKWARD:
        return load.backward[0] * weight, load.backward[1] * weight
    return (0.0, load.sync) if kind == SYNC else (load.step_work, 0.0)
