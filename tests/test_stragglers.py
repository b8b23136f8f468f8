"""Issue 39: the straggler watch's arithmetic (runtime/stragglers.py), the busy seconds it compares with
(cost.estimate.stage_busy_seconds) and the splits a slow node's re-plan searches (search/mixed_splits.py).
The run itself, four ranks with one slowed, is tests/runtime/test_straggler_replan.py."""
from __future__ import annotations

import pytest
import torch

from fake_clock import FakeClock
from megatron_auto.cost.estimate import estimate_plan, stage_busy_seconds
from megatron_auto.runtime import node_speed, stragglers
from megatron_auto.runtime.planning import cluster_for_world
from megatron_auto.search import SearchConstraints, search_plan
from megatron_auto.search.mixed_splits import _apportion, mixed_stage_splits
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS, with_node_speeds
from megatron_auto.specs.training import TrainingSpec

PREDICTED = (2.0, 2.0, 2.0, 2.4)
ONE_PER_NODE = ((0, 1), (1, 1), (2, 1), (3, 1))
"""(first rank, ranks) of four one-rank nodes (ClusterSpec.node_ranks)."""


def test_a_rank_twice_as_slow_as_its_prediction_gets_half_speed():
    busy = [1.0 * p for p in PREDICTED]
    busy[2] *= 2.0
    finding = stragglers.judge(busy, PREDICTED, ONE_PER_NODE, (1.0,) * 4, threshold=0.2)
    assert finding.changed and finding.node_speeds == (1.0, 1.0, 0.5, 1.0)
    assert finding.slowdowns[2] == pytest.approx(2.0)
    assert "rank 2 (node 2) at 2.00x" in finding.summary(ONE_PER_NODE, 0.2)


def test_the_median_takes_out_the_cost_models_common_error_and_noise_within_the_threshold_is_no_finding():
    busy = [3.1 * p * f for p, f in zip(PREDICTED, (1.0, 1.1, 0.9, 1.15))]  # the model 3x off, 15% noise
    finding = stragglers.judge(busy, PREDICTED, ONE_PER_NODE, (1.0,) * 4, threshold=0.2)
    assert not finding.changed and finding.node_speeds == (1.0,) * 4


def test_speeds_compound_with_the_planned_ones_and_a_recovered_node_returns_to_full_speed():
    planned = (1.0, 1.0, 0.5, 1.0)  # the plan already prices node 2 at half speed
    on_plan = stragglers.judge(list(PREDICTED), PREDICTED, ONE_PER_NODE, planned, 0.2)
    assert not on_plan.changed
    slower = stragglers.judge([2.0, 2.0, 3.0, 2.4], PREDICTED, ONE_PER_NODE, planned, 0.2)
    assert slower.node_speeds[2] == pytest.approx(0.35)  # 0.5 / 1.5, in steps of 0.05
    recovered = stragglers.judge([2.0, 2.0, 1.0, 2.4], PREDICTED, ONE_PER_NODE, planned, 0.2)
    assert recovered.node_speeds == (1.0,) * 4


def test_a_node_of_several_ranks_goes_at_its_slowest_ranks_pace():
    finding = stragglers.judge([1.0, 1.0, 1.0, 1.8], [1.0] * 4, ((0, 2), (2, 2)), (1.0, 1.0), 0.2)
    assert finding.node_speeds == (1.0, 0.55)  # 1 / 1.8, in steps of 0.05


def test_nodes_of_different_sizes_are_judged_by_their_own_ranks():
    """A node of two ranks beside two of one (torchrun agents with different --nproc-per-node): rank 2 is the
    second node's only rank, and the summary names it so."""
    nodes = ((0, 2), (2, 1), (3, 1))
    finding = stragglers.judge([1.0, 1.0, 2.0, 1.0], [1.0] * 4, nodes, (1.0,) * 3, 0.2)
    assert finding.node_speeds == (1.0, 0.5, 1.0)
    assert "rank 2 (node 1) at 2.00x" in finding.summary(nodes, 0.2)


def test_only_two_windows_in_a_row_that_agree_are_acted_on():
    planned = (1.0,) * 4
    slow = stragglers.judge([2.0, 2.0, 4.0, 2.4], PREDICTED, ONE_PER_NODE, planned, 0.2)
    slower = stragglers.judge([2.0, 2.0, 4.8, 2.4], PREDICTED, ONE_PER_NODE, planned, 0.2)
    calm = stragglers.judge(list(PREDICTED), PREDICTED, ONE_PER_NODE, planned, 0.2)
    other = stragglers.judge([4.0, 2.0, 2.0, 2.4], PREDICTED, ONE_PER_NODE, planned, 0.2)
    assert stragglers.confirmed(None, slow) is None
    assert stragglers.confirmed(calm, slow) is None and stragglers.confirmed(slow, calm) is None
    assert stragglers.confirmed(other, slow) is None  # another node each time: no node stays slow
    both = stragglers.confirmed(slow, slower)
    assert both.changed and both.node_speeds == (1.0, 1.0, 0.45, 1.0)  # the mean of 0.5 and 0.4


def test_the_injected_slowdown_is_read_per_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = {node_speed.SLOW_ENV: "2:2"}
    assert [node_speed.injected_slowdown(rank, env) for rank in range(4)] == [1.0, 1.0, 2.0, 1.0]
    env = {node_speed.SLOW_ENV: "1:2:3"}
    assert [node_speed.injected_slowdown(rank, env) for rank in range(3)] == [3.0, 6.0, 3.0]
    assert node_speed.injected_slowdown(0, {}) == 1.0 and node_speed.emulated_slowdown(0, {}) is None
    assert node_speed.emulated_slowdown(0, {node_speed.SLOW_ENV: "1:2"}) == 1.0  # a healthy rank under the switch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert node_speed.injected_slowdown(1, {node_speed.SLOW_ENV: "1:2"}) == 1.0
    assert node_speed.emulated_slowdown(1, {node_speed.SLOW_ENV: "1:2"}) is None


def test_the_busy_clock_counts_forward_and_backward_passes_stretched_by_the_slowdown(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(stragglers, "time", fake)
    clock = stragglers.BusyClock(torch.device("cpu"), slowdown=2.0)
    for name, seconds in (("forward-compute", 0.1), ("backward-compute", 0.2), ("forward-recv", 5.0)):
        timer = clock(name, log_level=2)
        timer.start()
        fake.compute(seconds, seconds)
        timer.stop()
    assert clock.take() == pytest.approx(2.0 * 0.3)  # the receive is waiting, not work
    assert clock.take() == 0.0


@pytest.mark.parametrize("wall_s, lasts_s", [(0.1, 0.5), (0.3, 0.5), (0.7, 0.7)])
def test_a_slowed_pass_lasts_its_cpu_seconds_times_the_slowdown_whatever_shares_its_core(monkeypatch, wall_s, lasts_s):
    """0.1 s of compute at slowdown 5: 0.5 s, also when other processes stretched the compute to 0.3 s of wall
    time; a pass stretched beyond 0.5 s sleeps no more."""
    fake = FakeClock()
    monkeypatch.setattr(stragglers, "time", fake)
    clock = stragglers.BusyClock(torch.device("cpu"), slowdown=5.0)
    timer = clock("forward-compute")
    timer.start()
    fake.compute(0.1, wall_s)
    timer.stop()
    assert clock.take() == pytest.approx(lasts_s)


def test_stage_busy_seconds_are_the_stages_passes_without_their_waits():
    model = MODEL_PRESETS["llama3-8b"]
    cluster = CLUSTER_PRESETS["dgx-h100-80gb"].with_nodes(4)
    training = TrainingSpec.for_precision("bf16", 128)
    plan = search_plan(model, cluster, training, "megatron", SearchConstraints(pp=4)).plan
    busy = stage_busy_seconds(plan, model, cluster, training)
    prediction = estimate_plan(plan, model, cluster, training)
    assert len(busy) == 4 and all(0 < b < s for b, s in zip(busy, prediction.stage_time_s))
    slowed = with_node_speeds(cluster, (1.0, 1.0, 0.5, 1.0))
    slow_busy = stage_busy_seconds(plan, model, slowed, training)
    assert slow_busy[:2] == pytest.approx(busy[:2]) and slow_busy[2] > 1.6 * busy[2]


def test_a_slow_nodes_replan_gives_it_layers_in_proportion_to_its_speed():
    assert _apportion(16, [1, 1, 0.5, 1]) == (5, 5, 2, 4)
    assert _apportion(80, [3, 3, 1, 1]) == (30, 30, 10, 10)
    assert _apportion(5, [1, 1, 1, 0.01]) == (2, 1, 1, 1)
    assert sum(_apportion(61, [1.0, 0.7, 0.3, 0.9])) == 61
    cluster = with_node_speeds(cluster_for_world(CLUSTER_PRESETS["dgx-h100-80gb"], 4, 1), (1.0, 1.0, 0.5, 1.0))
    model = MODEL_PRESETS["llama3-8b"]
    splits = mixed_stage_splits(model, cluster, TrainingSpec.for_precision("bf16", 128), 1, 4)
    assert (9, 9, 5, 9) in splits, splits  # 32 layers at speeds 1 : 1 : 0.5 : 1
    assert all(sum(split) == model.num_layers for split in splits)
