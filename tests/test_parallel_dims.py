"""ParallelDims: the one record of parallel degrees, its one check, and the records that derive from it."""
import dataclasses

import pytest

from megatron_auto.errors import UserError
from megatron_auto.parallel_dims import ParallelDims, check_stage_degrees
from megatron_auto.plan import LayerStrategy
from megatron_auto.runtime.layout import MegatronLayout, layout_from_plan
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

DEGREE_NAMES = {field.name for field in dataclasses.fields(ParallelDims)}
LONG_NAMES = {"tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel", "expert_parallel",
              "expert_tensor_parallel", "virtual_stages"}


def test_the_world_splits_in_megatron_cores_rank_order():
    dims = ParallelDims.for_world(64, tp=4, cp=2, pp=2, vp=3, ep=4, etp=1)
    assert (dims.tp, dims.cp, dims.dp, dims.pp, dims.vp) == (4, 2, 4, 2, 3)
    assert (dims.world_size, dims.stage_gpus, dims.gradient_dp) == (64, 32, 8)
    # The expert groups partition a stage's tp x cp x dp = 32 ranks as etp 1 x ep 4 x expert-dp 8.
    assert (dims.expert_tp, dims.expert_dp) == (1, 8)
    assert ParallelDims(tp=2, dp=4).expert_tp == 2  # etp unset: Megatron's default, the dense tp


@pytest.mark.parametrize("degrees, message", [
    (dict(tp=3), "world size 8 is not divisible by TP 3 x PP 1 = 3"),
    (dict(tp=2, cp=3), "world size 8 is not divisible by TP 2 x CP 3 x PP 1 = 6"),
    (dict(tp=2, dp=2), "--dp 2 does not match the world size: 8 GPUs / (TP 2 x PP 1) = 4"),
    (dict(ep=3), "EP x expert TP = 3 x 1 must divide TP x DP = 1 x 8"),
    (dict(tp=2, cp=2, ep=8), "EP x expert TP = 8 x 2 must divide TP x CP x DP = 2 x 2 x 2"),
    (dict(tp=0), "tp must be an integer of at least 1, got 0"),
    (dict(etp=0), "etp must be an integer of at least 1, got 0"),
    (dict(vp=2), "vp = 2 model chunks per stage need pp of 2 or more"),
])
def test_degrees_that_do_not_fit_the_world_are_one_user_error(degrees, message):
    with pytest.raises(UserError) as error:
        ParallelDims.for_world(8, **degrees)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_record_itself_refuses_groups_megatron_core_cannot_form():
    with pytest.raises(ValueError, match="ep x etp = 4 x 1 does not divide tp x cp x dp = 2"):
        ParallelDims(dp=2, ep=4, etp=1)
    with pytest.raises(ValueError, match="pp must be an integer of at least 1"):
        ParallelDims(pp=0)
    with pytest.raises(ValueError, match="cp must be an integer of at least 1, got 1.5"):
        check_stage_degrees(1, 1.5, 1)


def test_micro_batches_need_micro_batch_times_dp_to_divide_the_global_batch():
    dims = ParallelDims(tp=2, dp=4)
    assert dims.micro_batches(64, 2) == 8
    with pytest.raises(UserError, match=r"global batch 12 is not divisible by micro batch x DP = 8 \(2 x 4\)"):
        dims.micro_batches(12, 2)


def test_every_record_of_degrees_uses_the_one_naming_scheme():
    """MegatronLayout holds a ParallelDims; the others name their degrees as it does, never in the long
    names Megatron-LM's flags use."""
    assert {field.name: field.type for field in dataclasses.fields(MegatronLayout)}["dims"] in (ParallelDims,
                                                                                                 "ParallelDims")
    for record in (MegatronLayout, ManualParallelism, UniformConfig, SearchConstraints, LayerStrategy):
        names = {field.name for field in dataclasses.fields(record)}
        assert not names & LONG_NAMES, (record.__name__, names & LONG_NAMES)
        assert {"tp", "pp", "cp"} & names or record is MegatronLayout
    for record in (ManualParallelism, UniformConfig, SearchConstraints):
        assert {"tp", "pp", "cp", "ep", "etp"} <= {field.name for field in dataclasses.fields(record)}


MODEL = uniform_model("t", 8, 256, 8, seq_length=128, vocab_size=512)
CLUSTER = CLUSTER_PRESETS["dgx-a100-80gb"]


def test_flags_search_configs_and_layouts_derive_the_same_dims():
    """The same degrees reach one ParallelDims from the launch line's flags, from the search's config,
    and back from either one's plan through the runtime's layout."""
    flags = ManualParallelism(tp=2, pp=2, micro_batch_size=1, global_batch_size=16, layers_per_virtual_stage=2,
                              sequence_parallel=True)
    config = UniformConfig(tp=2, pp=2, micro_batch_size=1, vp=2, sequence_parallel=True)
    manual = plan_from_flags(MODEL, 8, flags)
    searched = build_uniform_plan(MODEL, CLUSTER, TrainingSpec(global_batch_size=16), config)
    expected = ParallelDims(tp=2, dp=2, pp=2, vp=2)
    assert config.dims(8) == dataclasses.replace(flags.dims(8), vp=2) == expected
    assert layout_from_plan(manual).dims == layout_from_plan(searched).dims == expected


def test_a_layer_strategy_is_checked_by_the_same_rule():
    with pytest.raises(ValueError, match="ep x etp = 4 x 2 does not divide tp x cp x dp = 4"):
        LayerStrategy(tp=2, dp=2, ep=4)
    with pytest.raises(ValueError, match="dp must be an integer of at least 1, got 0"):
        LayerStrategy(tp=1, dp=0)
