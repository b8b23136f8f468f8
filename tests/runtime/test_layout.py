"""Plan <-> Megatron layout, without starting any process."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.errors import UserError
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import Chunk
from megatron_auto.runtime.layout import layout_from_plan
from megatron_auto.runtime.manual_plan import (ManualParallelism, chunk_layer_counts, plan_from_flags,
                                               stage_layer_counts)
from megatron_auto.specs.model import uniform_model

MODEL = uniform_model("t", 4, 64, 4, seq_length=32, vocab_size=256)


def test_manual_flags_round_trip_through_the_plan():
    flags = ManualParallelism(tp=2, pp=2, micro_batch_size=1, global_batch_size=8,
                              first_stage_layers=3, last_stage_layers=1, sequence_parallel=True,
                              distributed_optimizer=True, recompute_granularity="selective")
    layout = layout_from_plan(plan_from_flags(MODEL, 8, flags))
    assert (layout.dims.tp, layout.dims.pp, layout.dims.dp) == (2, 2, 2)
    assert (layout.micro_batch_size, layout.num_micro_batches) == (1, 4)
    assert (layout.first_stage_layers, layout.last_stage_layers) == (3, 1)
    assert layout.sequence_parallel and layout.distributed_optimizer
    assert layout.recompute_granularity == "selective"


def test_virtual_stages_and_full_recompute():
    flags = ManualParallelism(pp=2, layers_per_virtual_stage=1, global_batch_size=4,
                              recompute_granularity="full", recompute_method="block", recompute_num_layers=1)
    plan = plan_from_flags(MODEL, 2, flags)
    assert plan.virtual_stages == 2
    layout = layout_from_plan(plan)
    assert layout.dims.vp == 2
    assert (layout.recompute_granularity, layout.recompute_method, layout.recompute_num_layers) == ("full", "uniform", 1)


def test_megatron_stage_split():
    assert stage_layer_counts(8, 4, 1, 1) == [1, 3, 3, 1]
    with pytest.raises(UserError, match="do not split evenly"):
        stage_layer_counts(8, 4, 1, None)


@pytest.mark.parametrize("layers, pp, per_chunk, embedding, loss, expected", [
    (7, 2, None, True, False, [3, 4]),   # (7 + 1) / 2 = 4 a stage, the first builds one fewer
    (6, 2, None, True, True, [3, 3]),
    (7, 4, None, False, True, [2, 2, 2, 1]),
    (7, 2, 2, True, False, [1, 2, 2, 2]),  # virtual stages: the first chunk of the first stage
    (6, 2, 2, True, True, [1, 2, 2, 1]),
    (5, 1, None, True, True, [5]),
])
def test_embedding_and_loss_counted_in_the_pipeline_split_as_megatron_core_builds_them(
        layers, pp, per_chunk, embedding, loss, expected):
    flags = ManualParallelism(pp=pp, layers_per_virtual_stage=per_chunk,
                              account_for_embedding=embedding, account_for_loss=loss)
    assert chunk_layer_counts(layers, pp, flags) == expected


def test_a_virtual_split_that_counts_embedding_and_loss_round_trips_through_megatron_flags():
    model = uniform_model("t6", 6, 64, 4, seq_length=32, vocab_size=256)
    flags = ManualParallelism(pp=2, layers_per_virtual_stage=2, global_batch_size=4,
                              account_for_embedding=True, account_for_loss=True)
    plan = plan_from_flags(model, 2, flags)
    assert [len(c.layers) for c in plan.chunks] == [1, 2, 2, 1] and plan.virtual_stages == 2
    line = megatron_flags(plan)
    assert line[line.index("--num-layers-per-virtual-pipeline-stage") + 1] == "2"
    assert "--account-for-embedding-in-pipeline-split" in line and "--account-for-loss-in-pipeline-split" in line
    layout = layout_from_plan(plan)
    assert (layout.dims.vp, layout.account_for_embedding, layout.account_for_loss) == (2, True, True)
    loss_only = plan_from_flags(uniform_model("t7", 7, 64, 4, seq_length=32, vocab_size=256), 2,
                                ManualParallelism(pp=2, layers_per_virtual_stage=2, global_batch_size=4,
                                                  account_for_loss=True))
    assert [len(c.layers) for c in loss_only.chunks] == [2, 2, 2, 1]
    assert "--account-for-embedding-in-pipeline-split" not in megatron_flags(loss_only)
    assert layout_from_plan(loss_only).account_for_loss and not layout_from_plan(loss_only).account_for_embedding


@pytest.mark.parametrize("flags, message", [
    (dict(pp=2, account_for_embedding=True, first_stage_layers=1), "cannot go with"),
    (dict(pp=2, account_for_embedding=True), "do not split evenly"),
    (dict(pp=2, layers_per_virtual_stage=3, account_for_loss=True), "chunks of 3"),
    (dict(pp=2, layers_per_virtual_stage=1, account_for_embedding=True, account_for_loss=True),
     "without decoder layers"),
])
def test_pipeline_splits_megatron_core_would_not_build_are_user_errors(flags, message):
    with pytest.raises(UserError, match=message):
        plan_from_flags(MODEL, 2, ManualParallelism(global_batch_size=4, **flags))


def test_fewer_counted_layers_than_stages_is_a_user_error():
    with pytest.raises(UserError, match="1 layers and 2 counted for the embedding/loss do not split evenly over 4"):
        chunk_layer_counts(1, 4, ManualParallelism(pp=4, account_for_embedding=True,
                                                   account_for_loss=True))


def test_chunks_beyond_megatrons_split_flags_are_written_as_a_pipeline_layout():
    """Chunk sizes no split flag expresses go to Megatron-Core as --pipeline-model-parallel-layout, and the layout
    read back gives the same chunks (what the runtime builds: model.check_built_chunks)."""
    model = uniform_model("t6", 6, 64, 4, seq_length=32, vocab_size=256)
    plan = plan_from_flags(model, 2, ManualParallelism(pp=2, layers_per_virtual_stage=2,
                                                       global_batch_size=4, account_for_embedding=True,
                                                       account_for_loss=True))
    first, second, third, last = plan.chunks  # 1, 2, 2 and 1 layers
    one_layer = [Chunk((layer,)) for layer in plan.layer_strategies]
    for chunks, expected in (((first, second, last, third), "Et|t*2|t|t*2L"),  # a middle chunk one short
                             ((Chunk(plan.layer_strategies[:3]), *one_layer[3:]), "Et*3|t|t|tL")):
        odd = replace(plan, chunks=chunks)
        line = megatron_flags(odd)
        assert line[line.index("--pipeline-model-parallel-layout") + 1] == expected
        assert "--num-layers-per-virtual-pipeline-stage" not in line
        layout = layout_from_plan(odd)
        assert (layout.pipeline_layout, layout.dims.vp) == (expected, 2)
        again = plan_from_flags(model, 2, ManualParallelism(pp=2, global_batch_size=4,
                                                            pipeline_layout=expected))
        assert [len(c.layers) for c in again.chunks] == [len(c.layers) for c in chunks]
    # One chunk per stage with unequal middle stages: only a layout says it.
    flags = ManualParallelism(pp=4, global_batch_size=4, pipeline_layout="Et|ttt|tt|ttL")
    stages = plan_from_flags(uniform_model("t8", 8, 64, 4, seq_length=32, vocab_size=256), 4, flags)
    assert stages.stage_layer_counts() == (1, 3, 2, 2) and stages.virtual_stages == 1
    assert layout_from_plan(stages).pipeline_layout == "Et|t*3|t*2|t*2L"


@pytest.mark.parametrize("flags, message", [
    (dict(pipeline_layout="Et|tL", layers_per_virtual_stage=1),
     "--pipeline-model-parallel-layout cannot go with --num-layers-per-virtual-pipeline-stage"),
    (dict(pipeline_layout="Et|tL", first_stage_layers=1, account_for_loss=True),
     "cannot go with --decoder-first-pipeline-num-layers, --account-for-loss-in-pipeline-split"),
    (dict(pipeline_layout="Et*4|L"), "chunk 1 holds no decoder layer"),
    (dict(pipeline_layout="Et|t|tt|tL"), "places 5 decoder layers; the model has 4"),
    (dict(pipeline_layout="Et|t|tL"), "3 chunks do not divide over 2 pipeline stages"),
    (dict(pipeline_layout="tE|ttL"), "must start with the embedding E and end with the loss L"),
    (dict(pipeline_layout="Ett|tLt"), "must start with the embedding E and end with the loss L"),
    (dict(pipeline_layout="Ettm|tL"), "multi-token-prediction layers (m) go in one chunk, after every decoder"),
    (dict(pipeline_layout="Ett|tt|m|L"), "a stage of their own (Megatron-Core's standalone MTP), are not run"),
    (dict(pipeline_layout="Ett|txL"), "unknown layer character(s) x"),
])
def test_pipeline_layouts_megatron_core_or_this_runtime_would_not_build_are_user_errors(flags, message):
    with pytest.raises(UserError) as error:
        plan_from_flags(MODEL, 2, ManualParallelism(pp=2, global_batch_size=4, **flags))
    assert message in str(error.value)


def test_a_layout_of_several_chunks_needs_two_pipeline_stages():
    with pytest.raises(UserError, match="needs --pipeline-model-parallel-size 2 or more"):
        plan_from_flags(MODEL, 1, ManualParallelism(global_batch_size=4, pipeline_layout="Ett|ttL"))


def test_world_size_that_does_not_divide_is_a_user_error():
    with pytest.raises(UserError, match="not divisible"):
        plan_from_flags(MODEL, 6, ManualParallelism(tp=4))


MOE_MODEL = uniform_model("m", 4, 64, 4, seq_length=32, vocab_size=256, num_experts=4, moe_layer_freq=2,
                          add_bias_linear=False)


@pytest.mark.parametrize("flags, expected", [
    (dict(ep=2), (2, None)),
    (dict(ep=2, tp=2, sequence_parallel=True), (2, None)),
    (dict(ep=4, etp=1, tp=2, sequence_parallel=True), (4, 1)),
    (dict(), (1, None)),
])
def test_expert_degrees_reach_the_layout_on_the_moe_layers_only(flags, expected):
    plan = plan_from_flags(MOE_MODEL, 8, ManualParallelism(global_batch_size=8, **flags))
    layout = layout_from_plan(plan)
    assert (layout.dims.ep, layout.dims.etp) == expected
    dense = [s for layer, s in zip(MOE_MODEL.layers, plan.layer_strategies) if layer.moe is None]
    assert dense and all((s.ep, s.etp) == (1, None) for s in dense)


def test_chunks_megatron_core_built_otherwise_than_planned_stop_the_run(monkeypatch):
    from types import SimpleNamespace

    from megatron.core import parallel_state

    from megatron_auto.runtime.model import check_built_chunks

    def chunk(layers: int):
        return SimpleNamespace(decoder=SimpleNamespace(layers=[None] * layers))

    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda: 1)
    check_built_chunks([chunk(2), chunk(2)], (1, 2, 1, 2), 2)  # rank 1 holds chunks 1 and 3
    with pytest.raises(RuntimeError, match=r"pipeline rank 1: Megatron-Core built chunks of \[2, 1\] layers, "
                                           r"the plan has \[2, 2\]"):
        check_built_chunks([chunk(2), chunk(1)], (1, 2, 1, 2), 2)


def test_the_runtime_refuses_a_sliding_window_or_learnable_softmax_model_in_one_line():
    """plan and estimate price sliding-window attention and the learnable softmax (tests/test_sliding_window.py);
    this runtime's cores run neither, so a model that has one stops before Megatron-Core builds anything."""
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.config import transformer_config
    from megatron_auto.runtime.layout import MegatronLayout
    from megatron_auto.runtime.settings import TrainSettings
    from megatron_auto.specs.model import model_from_dict

    model = model_from_dict({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                             "vocab_size": 128, "window_size": 7})
    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1, global_batch_size=1)
    with pytest.raises(UserError, match="sliding-window attention is priced by plan and estimate, not built"):
        transformer_config(model, layout, TrainSettings(), "gloo")
    sinks = model_from_dict({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                             "vocab_size": 128, "softmax_type": "learnable"})
    with pytest.raises(UserError, match="softmax other than the vanilla one .* not built by this runtime"):
        transformer_config(sinks, layout, TrainSettings(), "gloo")


def test_the_runtime_refuses_a_plan_with_a_standalone_mtp_chunk_in_one_line():
    """estimate prices a layout that gives the MTP layers a chunk of their own (tests/test_mtp_cost.py); this
    runtime builds them beside the loss only."""
    from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
    from megatron_auto.specs.presets import CLUSTER_PRESETS
    from megatron_auto.specs.training import TrainingSpec

    model = uniform_model("mtp", 8, 64, 4, seq_length=32, vocab_size=256, position_embedding_type="rope",
                          mtp_num_layers=1)
    config = UniformConfig(tp=1, pp=4, micro_batch_size=1, vp=2, chunk_layers=(1, 1, 1, 1, 1, 1, 2, 0),
                           mtp_chunk=6)
    plan = build_uniform_plan(model, CLUSTER_PRESETS["dgx-h100-80gb"], TrainingSpec(global_batch_size=8), config)
    with pytest.raises(UserError, match="in chunk 6, a stage of their own"):
        layout_from_plan(plan)
