"""Ranks that outnumber the CPU cores time-slice them: cost.estimate.time_sliced_iteration."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from megatron_auto.cost.estimate import estimate_plan, time_sliced_iteration
from megatron_auto.cost.models import core_share, profiled_cpu_cores
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


def test_no_waiting_gives_back_the_profiled_work():
    assert time_sliced_iteration(1.0, 1.0, 0.5, 2, 4) == pytest.approx(1.0)


def test_hand_computed_fixed_point():
    # Profiled work 0.8 s at half a core (W = 0.4 s of a whole core), 0.5 s waiting, 4 ranks on
    # 2 cores, TP groups of 2: 2x^2 + (2*0.5 - 0.4*4)x - 0.4*2*0.5 = 0 -> x = (0.6 + sqrt(0.36 + 3.2)) / 4.
    busy = (0.6 + math.sqrt(0.36 + 3.2)) / 4
    assert time_sliced_iteration(1.3, 0.8, 0.5, 2, 4, lockstep=2) == pytest.approx(0.5 + busy)
    # Lone ranks (g = 1) overlap more of their compute with others' waiting than TP pairs do.
    assert time_sliced_iteration(1.3, 0.8, 0.5, 2, 4) < time_sliced_iteration(1.3, 0.8, 0.5, 2, 4, lockstep=2)
    # Never below the work at a whole core plus the waiting, never above the plain sum.
    assert 0.5 + 0.4 <= time_sliced_iteration(1.3, 0.8, 0.5, 2, 4) <= 1.3


def test_estimate_and_bound_on_a_time_sliced_cluster():
    training = TrainingSpec.fp32(8)
    shared, alone = _cluster(4, 2), _cluster(4, 4)
    for config in (UniformConfig(tp=2, pp=2, micro_batch_size=1), UniformConfig(tp=1, pp=1, micro_batch_size=2)):
        plan = build_uniform_plan(MODEL, shared, training, config)
        sliced = estimate_plan(plan, MODEL, shared, training).iteration_time_s
        assert sliced < estimate_plan(plan, MODEL, alone, training).iteration_time_s
        assert pipeline_lower_bound(MODEL, shared, training, config, config.micro_batch_size, 1) <= sliced
