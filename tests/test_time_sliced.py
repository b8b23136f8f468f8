"""Ranks that outnumber the CPU cores time-slice them: cost.timeslice."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.models import core_share, profiled_cpu_cores
from megatron_auto.cost.pipeline import pipeline_time
from megatron_auto.cost.timeslice import StageLoad, schedule_order, simulate_iteration
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan, pipeline_lower_bound
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.profiles import LayerProfile, LayerTiming, MeasuredCosts, ModelProfile
from megatron_auto.specs.training import TrainingSpec

MODEL = uniform_model("m", 2, 64, 4, 32, 128)


def _cluster(processes: int, cores: int):
    timing = LayerTiming(tp=1, micro_batch=1, seq_length=32, forward_s=0.010, backward_s=0.020,
                         attention_core_forward_s=0.002, activation_bytes=100000, param_bytes=100000)
    profile = ModelProfile(name="m", device="cpu", precision="fp32", concurrent_processes=processes,
                           layers=(LayerProfile(layer=MODEL.layers[0], timings=(timing,)),), cpu_cores=cores)
    return replace(CLUSTER_PRESETS["cpu-gloo"], gpus_per_node=4, measured=MeasuredCosts(model=profile))


@pytest.mark.parametrize("processes, cores, share, sliced", [(4, 2, 0.5, 2), (4, 4, 1.0, 0), (2, 4, 1.0, 0),
                                                             (4, 0, 1.0, 0)])
def test_core_share_only_when_processes_outnumber_cores(processes, cores, share, sliced):
    cluster = _cluster(processes, cores)
    assert (core_share(cluster), profiled_cpu_cores(cluster)) == (share, sliced)


def _stage(work_f: float, work_b: float, wait: float = 0.0, group: int = 1, replicas: int = 1,
           sync: float = 0.0, step: float = 0.0) -> StageLoad:
    return StageLoad(group=group, replicas=replicas, forward=(work_f, wait), backward=(work_b, wait),
                     sync=sync, step_work=step)


def test_interleaved_order_is_megatrons():
    # p = 2, v = 2, m = 4: micro-batches in groups of p, chunk by chunk (schedules.get_model_chunk_id);
    # stage 0 warms up (p - 1) 2 + (v - 1) p = 4 chunk forwards, stage 1 warms up 2.
    order = schedule_order(2, 4, 2, 0)
    assert order[:5] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1), ("F", 0, 2)]
    assert order[5] == ("B", 1, 0)
    assert [op for op in schedule_order(2, 4, 2, 1)[:3]] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0)]
    for stage in range(2):
        ops = schedule_order(2, 4, 2, stage)
        assert sorted(ops) == sorted({(k, c, mb) for k in "FB" for c in range(2) for mb in range(4)})


@pytest.mark.parametrize("stages, micro_batches, chunks, schedule", [
    (1, 3, 1, "1f1b"), (2, 4, 1, "1f1b"), (4, 8, 1, "1f1b"), (4, 2, 1, "1f1b"), (2, 4, 2, "1f1b"),
    (4, 8, 2, "1f1b"), (2, 4, 1, "gpipe")])
def test_enough_cores_give_the_pipeline_formula(stages, micro_batches, chunks, schedule):
    # With a core per rank nothing is shared: balanced stages take (m + (p - 1) / v) T (cost.pipeline).
    forward, backward = 0.01, 0.02
    loads = [_stage(forward / chunks, backward / chunks)] * stages
    expected = pipeline_time([forward + backward] * stages, micro_batches, chunks)
    assert simulate_iteration(loads, micro_batches, chunks, cores=stages, schedule=schedule) == \
        pytest.approx(expected)


def test_one_stage_solves_the_mean_field_fixed_point():
    # W = 0.4 s at a whole core, 0.5 s waiting, 2 TP groups of 2 ranks on 2 cores: the other group
    # is busy f = x / (x + 0.5), so x = 0.4 (2 + 2 f) / 2, i.e. 2x^2 + (2*0.5 - 0.4*4)x - 0.4*2*0.5 = 0.
    busy = (0.6 + math.sqrt(0.36 + 3.2)) / 4
    load = StageLoad(group=2, replicas=2, forward=(0.4, 0.5), backward=(0.0, 0.0), sync=0.0, step_work=0.0)
    assert simulate_iteration([load], 1, 1, cores=2) == pytest.approx(0.5 + busy)
    # A lone group (no other replica) computes at a whole core.
    alone = StageLoad(group=2, replicas=1, forward=(0.4, 0.5), backward=(0.0, 0.0), sync=0.0, step_work=0.0)
    assert simulate_iteration([alone], 1, 1, cores=2) == pytest.approx(0.9)


def test_gradient_sync_and_step_are_not_shared():
    # One stage, 4 ranks on 2 cores, no waiting inside micro-batches: every op runs at half a core;
    # the sync is pure waiting by all ranks at once, so it adds in full.
    load = _stage(0.1, 0.2, replicas=4, sync=0.05, step=0.01)
    assert simulate_iteration([load], 3, 1, cores=2) == pytest.approx(3 * 0.6 + 0.05 + 0.02)


def test_pipeline_bubble_is_filled_by_the_other_stage():
    # 2 stages of 2 ranks on 2 cores, F = 1, B = 2 at a whole core, m = 4: while one stage waits
    # the other runs at a whole core, so the step is the total work over the cores (4 x 12 / 2),
    # below the sum model's (m + p - 1) x 6.
    loads = [_stage(1.0, 2.0, replicas=2)] * 2
    assert simulate_iteration(loads, 4, 1, cores=2) == pytest.approx(24.0)
    assert pipeline_time([6.0, 6.0], 4) == pytest.approx(30.0)


@pytest.mark.parametrize("config", [
    UniformConfig(tp=2, pp=2, micro_batch_size=1), UniformConfig(tp=1, pp=1, micro_batch_size=2),
    UniformConfig(tp=1, pp=2, micro_batch_size=1), UniformConfig(tp=1, pp=4, micro_batch_size=1),
    UniformConfig(tp=1, pp=2, micro_batch_size=1, vp=2), UniformConfig(tp=4, pp=1, micro_batch_size=4),
    UniformConfig(tp=1, pp=2, micro_batch_size=2, recompute="selective")])
def test_estimate_and_bound_on_a_time_sliced_cluster(config):
    model = uniform_model("m", 4, 64, 4, 32, 128)
    training = TrainingSpec.fp32(8)
    shared, alone = _cluster(4, 2), _cluster(4, 4)
    plan = build_uniform_plan(model, shared, training, config)
    sliced = estimate_plan(plan, model, shared, training).iteration_time_s
    summed = estimate_plan(plan, model, alone, training).iteration_time_s
    # Never above the sum of the stage times; below it wherever some ranks wait while others
    # compute (a pipeline's fill and drain). With one stage whose ranks all wait at once
    # (pure DP: the gradient sync; one TP group of all ranks) nothing is shared.
    assert sliced < summed if config.pp > 1 else sliced == pytest.approx(summed)
    bound = pipeline_lower_bound(model, shared, training, config, config.micro_batch_size, config.vp)
    assert bound <= sliced
    if (config.tp, config.pp) == (1, 1):
        # 4 ranks' layer compute at a whole core over 2 cores: nearly the whole step (the rest is
        # the embedding, head, gradient sync and optimizer); a whole core per rank alone gives half.
        assert bound >= 0.9 * sliced
