"""The measured runtime overhead (ClusterProfile.step_overhead_s / micro_batch_overhead_s)
enters estimate_plan and the search's stage tables identically."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.plan import LayerStrategy
from megatron_auto.search.tables import stage_fixed
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.profiles import ClusterProfile, MeasuredCosts
from megatron_auto.specs.training import TrainingSpec

MODEL = uniform_model("overhead-test", 4, 512, 8, seq_length=512, vocab_size=4096)
CLUSTER = replace(CLUSTER_PRESETS["dgx-a100-80gb"], num_nodes=1, gpus_per_node=4)
TRAINING = TrainingSpec(global_batch_size=16)
STEP_S, CHUNK_S = 0.25, 0.01


def _with_overhead(step_s: float, chunk_s: float):
    profile = ClusterProfile(name="t", backend="nccl", device="a100", world_size=4, gpus_per_node=4, curves=(),
                             grad_overlap_fraction=1.0, step_overhead_s=step_s, micro_batch_overhead_s=chunk_s)
    return replace(CLUSTER, measured=MeasuredCosts(cluster=profile))


BASE, OVERHEAD = _with_overhead(0.0, 0.0), _with_overhead(STEP_S, CHUNK_S)


@pytest.mark.parametrize("mbs", [1, 4])
def test_estimate_adds_the_step_and_per_micro_batch_overhead(mbs):
    plan = build_uniform_plan(MODEL, BASE, TRAINING, UniformConfig(tp=2, pp=1, micro_batch_size=mbs))
    before = estimate_plan(plan, MODEL, BASE, TRAINING)
    after = estimate_plan(plan, MODEL, OVERHEAD, TRAINING)
    m = plan.num_micro_batches
    assert after.iteration_time_s - before.iteration_time_s == pytest.approx(STEP_S + m * CHUNK_S)
    assert after.breakdown.runtime_s == pytest.approx(STEP_S + m * CHUNK_S)
    assert before.breakdown.runtime_s == 0.0


def test_interleaved_stages_pay_the_micro_batch_overhead_per_chunk():
    config = UniformConfig(tp=1, pp=2, micro_batch_size=1, vp=2)
    plan = build_uniform_plan(MODEL, BASE, TRAINING, config)
    after = estimate_plan(plan, MODEL, OVERHEAD, TRAINING)
    assert after.breakdown.runtime_s == pytest.approx(STEP_S + 2 * plan.num_micro_batches * CHUNK_S)


@pytest.mark.parametrize("stage", [0, 1])
def test_stage_tables_carry_the_same_overhead(stage):
    """search.tables.stage_fixed: the same per-micro-batch slot as estimate (v = 1)."""
    strategy = LayerStrategy(tp=2, dp=1)
    args = (MODEL, TRAINING, strategy, stage, 2, 2, 8, (strategy,), strategy)
    base = stage_fixed(args[0], BASE, *args[1:])
    with_overhead = stage_fixed(args[0], OVERHEAD, *args[1:])
    assert with_overhead.time - base.time == pytest.approx(CHUNK_S + STEP_S / 8)
