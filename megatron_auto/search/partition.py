"""Pipeline partition: which consecutive layers each stage holds.

Input: stage_times[s][a, n] = best seconds per micro-batch of stage s holding
layers a..a+n-1 (inf when it cannot fit), from the per-stage layer DP, so memory
balance is already inside each entry (Galvatron-BMW's balanced partition). The
objective is the schedule's time (m - 1) max_s T_s + sum_s T_s (cost.pipeline,
v = 1). It grows with both the max and the sum, so the optimum is found exactly
by taking each candidate bound tau on the max in increasing order, minimising the
sum under T_s <= tau, and stopping once (m - 1) tau alone reaches the best.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Partition:
    starts: tuple[int, ...]
    """First layer of each stage."""
    lengths: tuple[int, ...]
    """Layers of each stage."""
    stage_times: tuple[float, ...]
    """Seconds per micro-batch of each stage."""
    objective: float
    """(m - 1) max + sum of the stage times."""


def _min_sum_under(stage_times: Sequence[np.ndarray], num_layers: int, bound: float):
    """Min sum of stage times with every stage <= bound; returns (sum, per-stage argmins).

    reach[e] is the least sum that places layers 0..e-1 on the stages so far; a stage
    ending at e takes the shortest length among equal minima (the first in the argmin).
    """
    reach = np.full(num_layers + 1, np.inf)
    reach[0] = 0.0
    choices = []
    for table in stage_times:
        starts, lengths, valid = _span_index(num_layers, table.shape[1])
        cost = table[np.maximum(starts, 0), lengths]
        values = reach[np.maximum(starts, 0)] + np.where(valid & (cost <= bound), cost, np.inf)   # [L+1, W-1]
        shortest = values.argmin(axis=1)
        rows = np.arange(num_layers + 1)
        reach = values[rows, shortest]
        choices.append(np.where(np.isfinite(reach), starts[rows, shortest], -1))
    return reach[num_layers], choices


@lru_cache(maxsize=256)
def _span_index(num_layers: int, width: int):
    """For every end e (0..L) and length n (1..width-1): the start e - n and whether it is >= 0."""
    ends = np.arange(num_layers + 1)[:, None]
    lengths = np.arange(1, width)[None, :]
    starts = ends - lengths
    return starts, np.broadcast_to(lengths, starts.shape), starts >= 0


def partition_lower_bound(stage_times: Sequence[np.ndarray], num_layers: int, num_micro_batches: int,
                          enough: float = np.inf) -> float:
    """A lower bound on best_partition's objective: (m - 1) tau + S, with S the least sum
    and tau the least max over all partitions (each partition's sum and max are at
    least those); inf when no partition fits. Cheaper than the exact search. Returns
    the coarser (m - 1 + p) S / p (tau >= S / p) as soon as that reaches `enough`."""
    least_sum = float(_min_sum_under(stage_times, num_layers, np.inf)[0])
    stages = len(stage_times)
    if (not np.isfinite(least_sum) or num_micro_batches == 1
            or least_sum * (num_micro_batches - 1 + stages) / stages >= enough):
        return least_sum * (num_micro_batches - 1 + stages) / stages
    values = np.unique(np.concatenate([t[np.isfinite(t)] for t in stage_times]))
    return (num_micro_batches - 1) * float(values[_least_feasible_max(stage_times, num_layers, values)]) + least_sum


def _least_feasible_max(stage_times: Sequence[np.ndarray], num_layers: int, values: np.ndarray) -> int:
    """Index into the sorted `values` of the least bound on every stage's time under which some
    partition fits, by bisection (the largest value must be feasible)."""
    low, high = -1, values.size - 1
    while low + 1 < high:
        middle = (low + high) // 2
        if np.isfinite(_min_sum_under(stage_times, num_layers, values[middle])[0]):
            high = middle
        else:
            low = middle
    return high


def _unwind(choices: list[np.ndarray], num_layers: int) -> list[tuple[int, int]]:
    spans, end = [], num_layers
    for origin in reversed(choices):
        start = int(origin[end])
        spans.append((start, end - start))
        end = start
    return spans[::-1]


def best_partition(stage_times: Sequence[np.ndarray], num_layers: int, num_micro_batches: int) -> Optional[Partition]:
    """The partition minimising (m - 1) max T + sum T, or None if no stage layout fits."""
    values = np.unique(np.concatenate([t[np.isfinite(t)] for t in stage_times]))
    if values.size == 0:
        return None
    if not np.isfinite(_min_sum_under(stage_times, num_layers, values[-1])[0]):
        return None
    high = _least_feasible_max(stage_times, num_layers, values)
    best: Optional[Partition] = None
    bounds = values[high:] if num_micro_batches > 1 else values[-1:]
    for bound in bounds:
        if best is not None and (num_micro_batches - 1) * bound >= best.objective:
            break
        total, choices = _min_sum_under(stage_times, num_layers, bound)
        spans = _unwind(choices, num_layers)
        times = tuple(float(stage_times[s][a, n]) for s, (a, n) in enumerate(spans))
        objective = (num_micro_batches - 1) * max(times) + sum(times)
        if best is None or objective < best.objective:
            best = Partition(tuple(a for a, _ in spans), tuple(n for _, n in spans), times, objective)
    return best
