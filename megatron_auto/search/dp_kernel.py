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
    last_extra: np.ndarray
    """[S] seconds added when the prefix ends in strategy s (e.g. the re-layout after the last layer)."""


def _check_shapes(time: np.ndarray, mem: np.ndarray, transition: np.ndarray) -> None:
    if time.ndim != 2 or mem.shape != time.shape:
        raise ValueError(f"time and mem must both be [L, S]; got {time.shape} and {mem.shape}")
    s = time.shape[1]
    if transition.shape != (s, s):
        raise ValueError(f"transition must be [S, S] = [{s}, {s}]; got {transition.shape}")
    if mem.dtype.kind not in "iu" or (mem < 0).any():
        raise ValueError("mem must hold non-negative integer memory units")


def layer_dp(time: np.ndarray, mem: np.ndarray, transition: np.ndarray, budget_units: int,
             keep_choices: bool = True, groups: np.ndarray | None = None,
             last_extra: np.ndarray | None = None) -> LayerDPResult:
    """Minimal-time strategy per layer under `budget_units`, for every prefix length.

    `groups[s]` optionally names the layout of strategy s when the transition
    cost depends on layouts only (transition[a, b] = T[groups[a], groups[b]]);
    the min over predecessors then runs over G layouts instead of S strategies.
    `last_extra[s]` is added to a prefix whose last layer is in strategy s.
    """
    _check_shapes(time, mem, transition)
    last_extra = np.zeros(time.shape[1]) if last_extra is None else np.asarray(last_extra, dtype=float)
    best, final, choice = _batched_dp(time[None], mem[None], transition, np.array([budget_units]),
                                      groups, keep_choices, last_extra[None])
    return LayerDPResult(best_time=best[0], choice=choice[0] if keep_choices else choice[:0],
                         final=final[0], budget_units=budget_units, last_extra=last_extra)


def layer_dp_batch(time: np.ndarray, mem: np.ndarray, transition: np.ndarray, budget_units: np.ndarray,
                   groups: np.ndarray | None = None, last_extra: np.ndarray | None = None) -> np.ndarray:
    """B independent problems at once: time and mem are [B, L, S], budgets [B], last_extra [B, S].

    Returns best_time [B, L]. The search scores every (stage, transient ceiling)
    of a pipeline layout in one pass, and backtracks only the chosen ones.
    """
    if time.ndim != 3 or mem.shape != time.shape or budget_units.shape != (time.shape[0],):
        raise ValueError(f"time and mem must be [B, L, S] and budgets [B]; got {time.shape}, {mem.shape}, {budget_units.shape}")
    _check_shapes(time[0], mem[0], transition)
    last_extra = np.zeros((time.shape[0], time.shape[2])) if last_extra is None else last_extra
    return _batched_dp(time, mem, transition, budget_units, groups, keep_choices=False, last_extra=last_extra)[0]


def _batched_dp(time, mem, transition, budgets, groups, keep_choices, last_extra):
    batch, num_layers, num_strategies = time.shape
    top = int(budgets.max())
    groups = np.arange(num_strategies) if groups is None else np.asarray(groups)
    layout_cost, members = _layout_transitions(transition, groups)
    # The predecessor table is gathered through a flat index into a copy padded
    # with one row of +inf in front: u - mem < 0 lands on that row, so no mask.
    height = top + 2
    shift = (np.arange(top + 1)[None, :, None] + 1) * num_strategies
    base = (np.arange(batch) * height * num_strategies)[:, None, None] + np.arange(num_strategies)[None, None, :]
    padded = np.full((batch, height, num_strategies), np.inf)
    choice = np.zeros((batch, num_layers if keep_choices else 0, top + 1, num_strategies), dtype=np.int32)
    final = np.empty((batch, num_layers if keep_choices else 0, top + 1, num_strategies))
    best = np.empty((batch, num_layers))
    previous = None
    for layer in range(num_layers):
        if previous is None:
            padded[:, 1:, :] = 0.0
        else:
            padded[:, 1:, :], best_predecessor = _reach(previous, layout_cost, members, groups, keep_choices)
            if keep_choices:
                choice[:, layer] = best_predecessor
        offsets = np.maximum(shift - mem[:, layer][:, None, :] * num_strategies, 0) + base
        current = np.take(padded, offsets) + time[:, layer][:, None, :]
        best[:, layer] = (current[np.arange(batch), budgets, :] + last_extra).min(axis=-1)
        if keep_choices:
            final[:, layer] = current
        previous = current
    return best, final, choice


def _layout_transitions(transition: np.ndarray, groups: np.ndarray):
    """[G, G] layout-to-layout costs and the member strategies of each layout."""
    count = int(groups.max()) + 1
    members = [np.nonzero(groups == g)[0] for g in range(count)]
    if any(m.size == 0 for m in members):
        raise ValueError("groups must number the layouts 0..G-1 with no gaps")
    representative = np.array([m[0] for m in members])
    layout_cost = transition[np.ix_(representative, representative)]
    if not np.array_equal(layout_cost[groups][:, groups], transition):
        raise ValueError("transition costs must depend on the layouts named by groups only")
    return layout_cost, members


def _reach(previous: np.ndarray, layout_cost: np.ndarray, members, groups: np.ndarray, keep_choices: bool):
    """min over predecessors s' of previous[..., s'] + transition[s', s], and the argmin."""
    best_in_layout = np.stack([previous[..., m].min(axis=-1) for m in members], axis=-1)       # [B, U, G]
    candidates = best_in_layout[..., :, None] + layout_cost                                   # [B, U, G, G]
    best_layout = candidates.argmin(axis=-2)                                                  # [B, U, G]
    reach_layout = np.take_along_axis(candidates, best_layout[..., None, :], axis=-2)[..., 0, :]
    reach = reach_layout[..., groups]
    if not keep_choices:
        return reach, None
    arg_in_layout = np.stack([m[previous[..., m].argmin(axis=-1)] for m in members], axis=-1)  # [B, U, G]
    return reach, np.take_along_axis(arg_in_layout, best_layout[..., groups], axis=-1)


def backtrack(result: LayerDPResult, mem: np.ndarray, num_layers: int) -> list[int]:
    """Strategy indices of the best plan for the first `num_layers` layers."""
    layer = num_layers - 1
    units = result.budget_units
    strategy = int((result.final[layer, units] + result.last_extra).argmin())
    picks = [strategy]
    while layer > 0:
        units -= int(mem[layer, strategy])
        previous = int(result.choice[layer, units, strategy])
        layer -= 1
        strategy = previous
        picks.append(strategy)
    return picks[::-1]
