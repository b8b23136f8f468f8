"""Dynamic programming over layers under a memory budget (Galvatron's DPAlg).

Arrays in, arrays out. For layers 0..L-1 and strategies 0..S-1:
  f_l[u, s] = min time of layers 0..l with layer l in strategy s, using at most u
              memory units,
  f_l[u, s] = time[l, s] + min_s' (f_{l-1}[u - mem[l, s], s'] + transition[s', s]).
The best prefix of k layers is min_s f_{k-1}[budget, s]: one pass answers every
stage length that starts at the first row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerDPResult:
    best_time: np.ndarray
    """[L] minimal time of the first k+1 layers within the budget (inf if none fits)."""
    choice: np.ndarray
    """[L, U+1, S] argmin predecessor strategy, indexed by the units left for the
    layers before (u - mem[l, s]), for backtracking."""
    final: np.ndarray
    """[L, U+1, S] the f_l tables' values at each (units, strategy)."""
    budget_units: int


def _check_shapes(time: np.ndarray, mem: np.ndarray, transition: np.ndarray) -> None:
    if time.ndim != 2 or mem.shape != time.shape:
        raise ValueError(f"time and mem must both be [L, S]; got {time.shape} and {mem.shape}")
    s = time.shape[1]
    if transition.shape != (s, s):
        raise ValueError(f"transition must be [S, S] = [{s}, {s}]; got {transition.shape}")
    if mem.dtype.kind not in "iu" or (mem < 0).any():
        raise ValueError("mem must hold non-negative integer memory units")


def layer_dp(time: np.ndarray, mem: np.ndarray, transition: np.ndarray, budget_units: int,
             keep_choices: bool = True) -> LayerDPResult:
    """Minimal-time strategy per layer under `budget_units`, for every prefix length.

    With keep_choices=False only best_time is filled (about twice as fast): the
    search scores many stages and backtracks only the chosen ones.
    """
    _check_shapes(time, mem, transition)
    num_layers, num_strategies = time.shape
    units = np.arange(budget_units + 1)
    columns = np.arange(num_strategies)
    choice = np.zeros((num_layers if keep_choices else 0, budget_units + 1, num_strategies), dtype=np.int32)
    final = np.empty((num_layers, budget_units + 1, num_strategies))
    no_transition_cost = not transition.any()
    previous = None
    for layer in range(num_layers):
        if previous is None:
            reach = np.zeros((budget_units + 1, num_strategies))
        elif keep_choices:
            candidates = previous[:, :, None] + transition[None, :, :]
            choice[layer] = candidates.argmin(axis=1)
            reach = np.take_along_axis(candidates, choice[layer][:, None, :], axis=1)[:, 0, :]
        elif no_transition_cost:
            reach = np.repeat(previous.min(axis=1, keepdims=True), num_strategies, axis=1)
        else:
            reach = (previous[:, :, None] + transition[None, :, :]).min(axis=1)
        source = units[:, None] - mem[layer][None, :]
        valid = source >= 0
        current = np.where(valid, reach[np.clip(source, 0, None), columns] + time[layer], np.inf)
        final[layer] = current
        previous = current
    best = final[:, budget_units, :].min(axis=1)
    return LayerDPResult(best_time=best, choice=choice, final=final, budget_units=budget_units)


def backtrack(result: LayerDPResult, mem: np.ndarray, num_layers: int) -> list[int]:
    """Strategy indices of the best plan for the first `num_layers` layers."""
    layer = num_layers - 1
    units = result.budget_units
    strategy = int(result.final[layer, units].argmin())
    picks = [strategy]
    while layer > 0:
        units -= int(mem[layer, strategy])
        previous = int(result.choice[layer, units, strategy])
        layer -= 1
        strategy = previous
        picks.append(strategy)
    return picks[::-1]
