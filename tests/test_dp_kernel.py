"""The layer DP kernel against exhaustive enumeration, and its shape contract."""
import itertools

import numpy as np
import pytest

from megatron_auto.search.dp_kernel import backtrack, layer_dp
from megatron_auto.search.partition import best_partition


def _exhaustive(time, mem, transition, budget, k):
    best = np.inf
    for combo in itertools.product(range(time.shape[1]), repeat=k):
        if sum(mem[i, c] for i, c in enumerate(combo)) > budget:
            continue
        value = sum(time[i, c] for i, c in enumerate(combo))
        value += sum(transition[combo[i - 1], combo[i]] for i in range(1, k))
        best = min(best, value)
    return best


def test_layer_dp_matches_exhaustive_search_on_random_tables():
    rng = np.random.default_rng(7)
    for _ in range(150):
        layers, strategies = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        budget = int(rng.integers(0, 30))
        time = rng.random((layers, strategies))
        mem = rng.integers(0, 10, (layers, strategies))
        transition = rng.random((strategies, strategies)) * 0.5
        result = layer_dp(time, mem, transition, budget)
        fast = layer_dp(time, mem, transition, budget, keep_choices=False)
        for k in range(1, layers + 1):
            expected = _exhaustive(time, mem, transition, budget, k)
            assert result.best_time[k - 1] == pytest.approx(expected) if np.isfinite(expected) \
                else np.isinf(result.best_time[k - 1])
            assert fast.best_time[k - 1] == result.best_time[k - 1]
            if np.isfinite(expected):
                picks = backtrack(result, mem, k)
                assert sum(mem[i, c] for i, c in enumerate(picks)) <= budget
                value = sum(time[i, c] for i, c in enumerate(picks)) + sum(
                    transition[picks[i - 1], picks[i]] for i in range(1, k))
                assert value == pytest.approx(expected)


def test_layout_grouped_transitions_give_the_same_optimum():
    rng = np.random.default_rng(11)
    for _ in range(80):
        layers, layouts = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        groups = np.concatenate([np.arange(layouts), rng.integers(0, layouts, int(rng.integers(0, 3)))])
        layout_cost = rng.random((layouts, layouts)) * 0.5
        transition = layout_cost[groups][:, groups]
        time = rng.random((layers, groups.size))
        mem = rng.integers(0, 8, (layers, groups.size))
        budget = int(rng.integers(0, 20))
        grouped = layer_dp(time, mem, transition, budget, groups=groups)
        plain = layer_dp(time, mem, transition, budget)
        np.testing.assert_allclose(grouped.best_time, plain.best_time)
        for k in range(1, layers + 1):
            if np.isfinite(plain.best_time[k - 1]):
                picks = backtrack(grouped, mem, k)
                value = sum(time[i, c] for i, c in enumerate(picks)) + sum(
                    transition[picks[i - 1], picks[i]] for i in range(1, k))
                assert value == pytest.approx(plain.best_time[k - 1])
                assert sum(mem[i, c] for i, c in enumerate(picks)) <= budget


def test_last_extra_is_charged_to_the_prefix_end():
    rng = np.random.default_rng(5)
    for _ in range(60):
        layers, strategies = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        time, transition = rng.random((layers, strategies)), rng.random((strategies, strategies))
        mem, budget = rng.integers(0, 6, (layers, strategies)), int(rng.integers(0, 15))
        last = rng.random(strategies)
        result = layer_dp(time, mem, transition, budget, last_extra=last)
        for k in range(1, layers + 1):
            best = np.inf
            for combo in itertools.product(range(strategies), repeat=k):
                if sum(mem[i, c] for i, c in enumerate(combo)) <= budget:
                    value = sum(time[i, c] for i, c in enumerate(combo)) + last[combo[-1]]
                    best = min(best, value + sum(transition[combo[i - 1], combo[i]] for i in range(1, k)))
            if np.isfinite(best):
                assert result.best_time[k - 1] == pytest.approx(best)
                picks = backtrack(result, mem, k)
                value = sum(time[i, c] for i, c in enumerate(picks)) + last[picks[-1]] + sum(
                    transition[picks[i - 1], picks[i]] for i in range(1, k))
                assert value == pytest.approx(best)
            else:
                assert np.isinf(result.best_time[k - 1])


def test_groups_must_describe_the_transitions():
    transition = np.array([[0.0, 1.0], [2.0, 0.0]])
    with pytest.raises(ValueError, match="depend on the layouts"):
        layer_dp(np.zeros((1, 2)), np.zeros((1, 2), dtype=int), transition, 3, groups=np.array([0, 0]))


def test_layer_dp_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="transition must be"):
        layer_dp(np.zeros((2, 3)), np.zeros((2, 3), dtype=int), np.zeros((2, 2)), 4)
    with pytest.raises(ValueError, match="integer memory units"):
        layer_dp(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((3, 3)), 4)


def test_partition_matches_exhaustive_search():
    rng = np.random.default_rng(3)
    for _ in range(60):
        layers, stages, m = int(rng.integers(2, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        if stages > layers:
            continue
        tables = [rng.random((layers, layers + 1)) + 0.1 for _ in range(stages)]
        for table in tables:
            table[:, 0] = np.inf
            table[rng.random(table.shape) < 0.2] = np.inf
        found = best_partition(tables, layers, m)
        best = np.inf
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            bounds = (0,) + cuts + (layers,)
            times = [tables[s][bounds[s], bounds[s + 1] - bounds[s]] for s in range(stages)]
            best = min(best, (m - 1) * max(times) + sum(times))
        if np.isinf(best):
            assert found is None
        else:
            assert found.objective == pytest.approx(best)
