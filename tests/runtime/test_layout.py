"""Plan <-> Megatron layout, without starting any process."""
from __future__ import annotations

import pytest

from megatron_auto.errors import UserError
from megatron_auto.runtime.layout import layout_from_plan
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags, stage_layer_counts
from megatron_auto.specs.model import uniform_model

MODEL = uniform_model("t", 4, 64, 4, seq_length=32, vocab_size=256)


def test_manual_flags_round_trip_through_the_plan():
    flags = ManualParallelism(tensor_parallel=2, pipeline_parallel=2, micro_batch_size=1, global_batch_size=8,
                              first_stage_layers=3, last_stage_layers=1, sequence_parallel=True,
                              distributed_optimizer=True, recompute_granularity="selective")
    layout = layout_from_plan(plan_from_flags(MODEL, 8, flags))
    assert (layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel) == (2, 2, 2)
    assert (layout.micro_batch_size, layout.num_micro_batches) == (1, 4)
    assert (layout.first_stage_layers, layout.last_stage_layers) == (3, 1)
    assert layout.sequence_parallel and layout.distributed_optimizer
    assert layout.recompute_granularity == "selective"


def test_virtual_stages_and_full_recompute():
    flags = ManualParallelism(pipeline_parallel=2, layers_per_virtual_stage=1, global_batch_size=4,
                              recompute_granularity="full", recompute_method="block", recompute_num_layers=1)
    plan = plan_from_flags(MODEL, 2, flags)
    assert plan.virtual_stages == 2
    layout = layout_from_plan(plan)
    assert layout.virtual_stages == 2
    assert (layout.recompute_granularity, layout.recompute_method, layout.recompute_num_layers) == ("full", "uniform", 1)


def test_megatron_stage_split():
    assert stage_layer_counts(8, 4, 1, 1) == [1, 3, 3, 1]
    with pytest.raises(UserError, match="do not split evenly"):
        stage_layer_counts(8, 4, 1, None)


def test_world_size_that_does_not_divide_is_a_user_error():
    with pytest.raises(UserError, match="not divisible"):
        plan_from_flags(MODEL, 6, ManualParallelism(tensor_parallel=4))


MOE_MODEL = uniform_model("m", 4, 64, 4, seq_length=32, vocab_size=256, num_experts=4, moe_layer_freq=2,
                          add_bias_linear=False)


@pytest.mark.parametrize("flags, expected", [
    (dict(expert_parallel=2), (2, None)),
    (dict(expert_parallel=2, tensor_parallel=2, sequence_parallel=True), (2, None)),
    (dict(expert_parallel=4, expert_tensor_parallel=1, tensor_parallel=2, sequence_parallel=True), (4, 1)),
    (dict(), (1, None)),
])
def test_expert_degrees_reach_the_layout_on_the_moe_layers_only(flags, expected):
    plan = plan_from_flags(MOE_MODEL, 8, ManualParallelism(global_batch_size=8, **flags))
    layout = layout_from_plan(plan)
    assert (layout.expert_parallel, layout.expert_tensor_parallel) == expected
    dense = [s for layer, s in zip(MOE_MODEL.layers, plan.layer_strategies) if layer.moe is None]
    assert dense and all((s.ep, s.etp) == (1, None) for s in dense)
