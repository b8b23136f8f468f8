"""Lower bounds on a stage's layer DP, cheap enough to skip candidates before the DP runs.

The layer DP (dp_kernel) minimises sum_l t[l, s_l] (plus transitions, all >= 0)
subject to sum_l mem[l, s_l] <= M, the stage's memory left after its fixed parts
(the DP's rounded-up units and transient ceiling only tighten this). For any
lambda >= 0 the Lagrangian relaxation gives

    min sum_l t[l, s_l]  >=  sum_l min_s (t[l, s] + lambda mem[l, s]) - lambda M

(weak duality; Martello & Toth, Knapsack Problems, 1990, ch. 2 for the
multiple-choice knapsack). The best lambda lies on a slope of the lower convex
hull of some layer's (mem, time) points, so those slopes are the ones tried.
Spans whose least memory exceeds M cannot fit and stay +inf, as in the DP. Strategies a
layer cannot run (time +inf in the tables: expert degrees on a dense layer) are left out.
"""
from __future__ import annotations

import numpy as np

from .tables import LayerTables, StageFixed

MAX_MULTIPLIERS = 64


def hull_slopes(memory: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Seconds per byte along the lower convex hull of one layer's (memory, time) points,
    where more memory buys less time."""
    runs = np.isfinite(time)
    memory, time = memory[runs], time[runs]
    order = np.lexsort((time, memory))
    hull: list[tuple[float, float]] = []
    for point in zip(memory[order], time[order]):
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], point) <= 0:
            hull.pop()
        hull.append(point)
    return np.array([(a[1] - b[1]) / (b[0] - a[0]) for a, b in zip(hull, hull[1:]) if b[0] > a[0] and b[1] < a[1]])


def _cross(o, a, b) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def multipliers(time: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """lambda = 0 and the hull slopes of every distinct layer row, at most MAX_MULTIPLIERS."""
    rows = {np.concatenate([t, m]).tobytes(): (t, m) for t, m in zip(time, memory)}
    slopes = [hull_slopes(m, t) for t, m in rows.values()]
    values = np.unique(np.concatenate([np.zeros(1)] + slopes))
    if values.size > MAX_MULTIPLIERS:
        values = np.unique(np.quantile(values, np.linspace(0, 1, MAX_MULTIPLIERS)))
    return values


def relaxed_spans(tables: LayerTables, fixed: list[StageFixed], budget: float, max_len: int,
                  num_layers: int, uniform: bool) -> list[np.ndarray]:
    """Per stage: [L, max_len+1] lower bounds of the layer DP's span times (+inf where no
    strategy choice fits; column 0 unused), each with the stage's fixed seconds added.
    With `uniform` layers every start gets the bounds of start 0."""
    rows = slice(0, 1) if uniform else slice(0, num_layers)
    spans = []
    for stage in fixed:
        runs = np.isfinite(tables.time[rows])
        memory = tables.state[rows] + stage.in_flight * tables.activation[rows]
        room = budget - stage.memory - stage.least_extra()
        lambdas = multipliers(tables.time[rows], memory)
        priced = np.where(runs[None], tables.time[rows][None] + lambdas[:, None, None] * memory[None],
                          np.inf).min(axis=-1)   # [K, rows]
        least_memory = np.where(runs, memory, np.inf).min(axis=1)
        bound = _uniform_spans if uniform else _layered_spans
        spans.append(bound(priced, least_memory, lambdas, room, num_layers, max_len) + stage.time)
    return spans


def _uniform_spans(priced, least_memory, lambdas, room, num_layers, max_len) -> np.ndarray:
    """Like layers: a span's bound depends on its length n alone, max_K (n priced_K - lambda_K room)."""
    lengths = np.arange(max_len + 1)
    bound = (lengths[None, :] * priced[:, :1] - lambdas[:, None] * room).max(axis=0)
    bound = np.where((lengths * least_memory[0] <= room) & (lengths > 0), bound, np.inf)
    starts = np.arange(num_layers)[:, None]
    return np.where(starts + lengths[None, :] <= num_layers, bound[None, :], np.inf)


def _layered_spans(priced, least_memory, lambdas, room, num_layers, max_len) -> np.ndarray:
    prefix = np.concatenate([np.zeros((lambdas.size, 1)), np.cumsum(priced, axis=1)], axis=1)
    least = np.concatenate([[0.0], np.cumsum(least_memory)])
    span = np.full((num_layers, max_len + 1), np.inf)
    for length in range(1, max_len + 1):
        starts = np.arange(0, num_layers - length + 1)
        bound = (prefix[:, starts + length] - prefix[:, starts] - lambdas[:, None] * room).max(axis=0)
        fits = least[starts + length] - least[starts] <= room
        span[starts, length] = np.where(fits, bound, np.inf)
    return span
