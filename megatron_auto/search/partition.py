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
    """Min sum of stage times with every stage <= bound; returns (sum, per-stage argmins)."""
    reach = np.full(num_layers + 1, np.inf)
    reach[0] = 0.0
    choices = []
    for table in stage_times:
        new = np.full(num_layers + 1, np.inf)
        origin = np.full(num_layers + 1, -1)
        for length in range(1, table.shape[1]):
            cost = table[:num_layers + 1 - length, length]
            values = reach[:num_layers + 1 - length] + np.where(cost <= bound, cost, np.inf)
            better = values < new[length:]
            new[length:][better] = values[better]
            origin[length:][better] = np.nonzero(better)[0]
        reach = new
        choices.append(origin)
    return reach[num_layers], choices


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
    low, high = -1, values.size - 1          # smallest feasible bound by bisection
    while low + 1 < high:
        middle = (low + high) // 2
        if np.isfinite(_min_sum_under(stage_times, num_layers, values[middle])[0]):
            high = middle
        else:
            low = middle
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
