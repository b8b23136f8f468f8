"""Plan: exact JSON round trip, byte-identical dumps, every validator, Megatron flags."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto import serde
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.errors import UserError
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import Chunk, LayerStrategy, Plan, load_plan, save_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec

MODEL = MODEL_PRESETS["tiny-gpt-8l"]          # 8 layers, h=128, 8 heads
CLUSTER = CLUSTER_PRESETS["dgx-a100-80gb"]     # 1 node x 8 GPUs
TRAINING = TrainingSpec(global_batch_size=16)


def uniform(**config) -> Plan:
    config = {"tp": 2, "pp": 2, "micro_batch_size": 2, **config}
    return build_uniform_plan(MODEL, CLUSTER, TRAINING, UniformConfig(**config))


def manual(layers_per_chunk, strategy, pp=2, world=8, batch=16, m=4, **kw) -> Plan:
    chunks = tuple(Chunk((strategy,) * n) for n in layers_per_chunk)
    return Plan(space=kw.pop("space", "megatron"), world_size=world, pipeline_parallel=pp,
                global_batch_size=batch, num_micro_batches=m, chunks=chunks,
                embedding=kw.pop("embedding", strategy), **kw)


# --- round trip -----------------------------------------------------------------

def test_plan_with_prediction_round_trips_exactly(tmp_path):
    plan = uniform(vp=2, sequence_parallel=True, distributed_optimizer=True, recompute="full")
    plan = replace(plan, prediction=estimate_plan(plan, MODEL, CLUSTER, TRAINING))
    assert serde.from_dict(Plan, json.loads(serde.dumps(plan))) == plan
    save_plan(plan, tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == plan
    assert (tmp_path / "plan.json").read_text() == serde.dumps(loaded)


def test_hybrid_plan_round_trips(tmp_path):
    a, b = LayerStrategy(tp=2, dp=2, sp=True), LayerStrategy(tp=1, dp=4, zero=3, recompute="full")
    plan = Plan(space="hybrid", world_size=8, pipeline_parallel=2, global_batch_size=16, num_micro_batches=2,
                chunks=(Chunk((a, b, a, b)), Chunk((b, b, a, a))), embedding=b, model=MODEL)
    save_plan(plan, tmp_path / "h.json")
    assert load_plan(tmp_path / "h.json") == plan


def test_identical_inputs_give_byte_identical_dumps():
    first, second = uniform(recompute="selective"), uniform(recompute="selective")
    first = replace(first, prediction=estimate_plan(first, MODEL, CLUSTER, TRAINING))
    second = replace(second, prediction=estimate_plan(second, MODEL, CLUSTER, TRAINING))
    assert serde.dumps(first) == serde.dumps(second)
    assert serde.dumps(first) != serde.dumps(uniform(recompute="full"))


def test_load_plan_rejects_bad_files(tmp_path):
    data = json.loads(serde.dumps(uniform()))
    (tmp_path / "v2.json").write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(UserError, match="schema_version 2"):
        load_plan(tmp_path / "v2.json")
    (tmp_path / "extra.json").write_text(json.dumps({**data, "tensor_parallel": 2}))
    with pytest.raises(UserError, match="unknown key"):
        load_plan(tmp_path / "extra.json")
    (tmp_path / "chunks.json").write_text(json.dumps({**data, "pipeline_parallel": 4}))
    with pytest.raises(UserError, match="chunks"):
        load_plan(tmp_path / "chunks.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        load_plan(tmp_path / "broken.json")


# --- validators -----------------------------------------------------------------

S22 = LayerStrategy(tp=2, dp=2)


def test_valid_manual_plan_accessors():
    plan = manual((3, 5), S22)
    assert plan.stage_layer_counts() == (3, 5)
    assert plan.gpus_per_stage == 4
    assert plan.local_micro_batch(S22) == 2  # 16 samples / 4 micro-batches / dp 2


def test_chunk_count_must_be_pp_times_v():
    with pytest.raises(ValueError, match="3 chunks"):
        manual((3, 3, 2), S22)
    with pytest.raises(ValueError, match="3 chunks"):
        manual((2, 2, 4), S22, virtual_stages=2)
    with pytest.raises(ValueError, match="at least one layer"):
        manual((8, 0), S22, space="hybrid")


def test_tp_times_dp_must_equal_stage_gpus():
    with pytest.raises(ValueError, match="tp x cp x dp = 2"):
        manual((4, 4), LayerStrategy(tp=2, dp=1))
    with pytest.raises(ValueError, match="embedding"):
        manual((4, 4), S22, embedding=LayerStrategy(tp=4, dp=2))
    with pytest.raises(ValueError, match="not divisible by pipeline_parallel"):
        manual((3, 3, 2), LayerStrategy(tp=2, dp=1), pp=3)


def test_batch_must_split_into_micro_batches_and_dp():
    with pytest.raises(ValueError, match="not divisible into 3"):
        manual((4, 4), S22, m=3)
    with pytest.raises(ValueError, match="does not split over dp=2"):
        manual((4, 4), S22, m=16)


def test_megatron_space_needs_one_layout():
    other = LayerStrategy(tp=4, dp=1)
    chunks = (Chunk((S22,) * 4), Chunk((other,) * 4))
    with pytest.raises(ValueError, match="one TP/DP/ZeRO/SP layout"):
        Plan(space="megatron", world_size=8, pipeline_parallel=2, global_batch_size=16,
             num_micro_batches=4, chunks=chunks, embedding=S22)
    hybrid = Plan(space="hybrid", world_size=8, pipeline_parallel=2, global_batch_size=16,
                  num_micro_batches=4, chunks=chunks, embedding=S22)
    assert not hybrid.is_uniform_layout()


def test_megatron_space_other_rules():
    # ZeRO-2 and -3 on every layer are Megatron-FSDP's optim_grads and optim_grads_params; one layout for all.
    z3 = LayerStrategy(tp=2, dp=2, zero=3)
    assert manual((4, 4), z3).embedding.zero == 3
    with pytest.raises(ValueError, match="one TP/DP/ZeRO/SP layout"):
        Plan(space="megatron", world_size=8, pipeline_parallel=2, global_batch_size=16, num_micro_batches=4,
             chunks=(Chunk((z3,) * 4), Chunk((S22,) * 4)), embedding=z3)
    mixed = (Chunk((replace(S22, recompute="selective"),) * 4), Chunk((S22,) * 4))
    with pytest.raises(ValueError, match="selectively"):
        Plan(space="megatron", world_size=8, pipeline_parallel=2, global_batch_size=16,
             num_micro_batches=4, chunks=mixed, embedding=S22)
    # Any chunk sizes are Megatron's (--pipeline-model-parallel-layout; tests/runtime/test_layout.py).
    assert manual((1, 3, 2, 2), S22, virtual_stages=2).num_layers == 8
    one = LayerStrategy(tp=2, dp=1)
    assert manual((1, 2, 3, 2), one, pp=4).stage_layer_counts() == (1, 2, 3, 2)
    assert manual((1, 3, 3, 1), one, pp=4).stage_layer_counts() == (1, 3, 3, 1)


def test_sequence_parallel_needs_tp():
    with pytest.raises(ValueError, match="tp > 1"):
        LayerStrategy(tp=1, dp=8, sp=True)
    for bad in ({"tp": 0}, {"zero": 4}, {"recompute": "partial"}):
        with pytest.raises(ValueError):
            LayerStrategy(**bad)


def test_model_must_match_layers_and_heads():
    with pytest.raises(ValueError, match="places 7 layers"):
        manual((3, 4), S22, model=MODEL)
    six_heads = uniform_model("six-heads", 4, 96, 6, seq_length=64, vocab_size=512)
    with pytest.raises(ValueError, match="does not divide the attention heads"):
        manual((2, 2), LayerStrategy(tp=4, dp=1), model=six_heads)
    assert manual((2, 2), LayerStrategy(tp=2, dp=2), model=six_heads).model is six_heads


def test_schedule_space_and_virtual_stage_rules():
    with pytest.raises(ValueError, match="space"):
        manual((4, 4), S22, space="galvatron")
    with pytest.raises(ValueError, match="schedule"):
        manual((4, 4), S22, schedule="zb")
    with pytest.raises(ValueError, match="virtual stages"):
        manual((2, 2, 2, 2), S22, virtual_stages=2, schedule="gpipe")
    with pytest.raises(ValueError, match="virtual stages"):
        manual((4, 4), LayerStrategy(tp=4, dp=2), pp=1, world=8, virtual_stages=2)
    with pytest.raises(ValueError, match="schema_version"):
        manual((4, 4), S22, schema_version=0)


# --- Megatron flags ---------------------------------------------------------------

BASE = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--micro-batch-size", "2", "--global-batch-size", "16"]


def test_flags_even_split_plain():
    assert megatron_flags(uniform()) == BASE


def test_flags_uneven_first_and_last():
    four = dict(tp=2, pp=4, micro_batch_size=4)
    head = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
            "--micro-batch-size", "4", "--global-batch-size", "16"]
    assert megatron_flags(uniform(**four, stage_layers=(1, 3, 3, 1))) == head + [
        "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "1"]
    assert megatron_flags(uniform(**four, stage_layers=(3, 2, 2, 1))) == head + [
        "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "1"]
    assert megatron_flags(uniform(**four, stage_layers=(1, 2, 2, 3))) == head + [
        "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "3"]
    assert megatron_flags(uniform(**four, stage_layers=(2, 2, 2, 2))) == head


def test_flags_uneven_one_side_only():
    four = dict(tp=2, pp=4, micro_batch_size=4)
    head = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
            "--micro-batch-size", "4", "--global-batch-size", "16"]
    # 12-layer model: (3, 3, 3, 3) is even; (3, 3, 3, 3) with the last stage changed to 1 over 10 layers.
    model = replace(MODEL, layers=MODEL.layers[:1] * 10)
    plan = build_uniform_plan(model, CLUSTER, TRAINING, UniformConfig(**four, stage_layers=(3, 3, 3, 1)))
    assert megatron_flags(plan) == head + ["--decoder-last-pipeline-num-layers", "1"]
    plan = build_uniform_plan(model, CLUSTER, TRAINING, UniformConfig(**four, stage_layers=(1, 3, 3, 3)))
    assert megatron_flags(plan) == head + ["--decoder-first-pipeline-num-layers", "1"]


def test_flags_virtual_stages():
    assert megatron_flags(uniform(vp=2)) == BASE + ["--num-layers-per-virtual-pipeline-stage", "2"]
    assert megatron_flags(uniform(vp=4)) == BASE + ["--num-layers-per-virtual-pipeline-stage", "1"]


def test_flags_full_recompute_uniform_and_block():
    assert megatron_flags(uniform(recompute="full")) == BASE + [
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    assert megatron_flags(uniform(recompute="full", recompute_num_layers=3)) == BASE + [
        "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"]
    # Block recompute counts per virtual chunk: 2-layer chunks, the first layer of each recomputed.
    flags = megatron_flags(uniform(recompute="full", recompute_num_layers=1, vp=2))
    assert flags == BASE + ["--num-layers-per-virtual-pipeline-stage", "2", "--recompute-granularity", "full",
                            "--recompute-method", "block", "--recompute-num-layers", "1"]


def test_flags_selective_sp_distributed_optimizer():
    plan = uniform(recompute="selective", sequence_parallel=True, distributed_optimizer=True)
    assert megatron_flags(plan) == BASE + ["--recompute-granularity", "selective", "--sequence-parallel",
                                           "--use-distributed-optimizer"]


def priced(plan: Plan, cluster=CLUSTER) -> Plan:
    return replace(plan, prediction=estimate_plan(plan, MODEL, cluster, TRAINING))


def test_flags_overlap_data_parallel_traffic_where_the_prediction_hides_it():
    # The GPU presets price DP traffic as hidden (grad_overlap 1); stock Megatron-LM hides it only with the flags.
    assert megatron_flags(priced(uniform())) == BASE + ["--overlap-grad-reduce"]
    assert megatron_flags(priced(uniform(distributed_optimizer=True))) == BASE + [
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    # cpu-gloo prices the reduce after the backward: no overlap flags; nor without data parallelism.
    assert megatron_flags(priced(uniform(), CLUSTER_PRESETS["cpu-gloo"])) == BASE
    assert megatron_flags(priced(uniform(tp=4))) == BASE[:1] + ["4"] + BASE[2:]
    # A plan file from before Prediction.grad_overlap existed loads with 0: no overlap flags, as before.
    loaded = serde.from_dict(Plan, {**serde.to_dict(priced(uniform())), "prediction": {
        k: v for k, v in serde.to_dict(priced(uniform()).prediction).items() if k != "grad_overlap"}})
    assert megatron_flags(loaded) == BASE


def test_flags_reject_hybrid_and_non_block_recompute():
    hybrid = replace(uniform(), space="hybrid")
    with pytest.raises(UserError, match="megatron-space"):
        megatron_flags(hybrid)
    full, none = replace(S22, recompute="full"), S22
    # Recompute the last layer of each chunk: not Megatron's block method (first N layers).
    odd = Plan(space="megatron", world_size=8, pipeline_parallel=2, global_batch_size=16, num_micro_batches=4,
               chunks=(Chunk((none, none, none, full)), Chunk((none, none, none, full))), embedding=S22)
    with pytest.raises(UserError, match="block method"):
        megatron_flags(odd)


def test_interleaving_needs_micro_batches_in_multiples_of_pp():
    # megatron-core 0.16.1 (pipeline_parallel/schedules.py) runs the interleaved
    # schedule in groups of microbatch_group_size_per_vp_stage = p micro-batches and raises
    # unless p <= m and m % p == 0. Here p=4, v=2 with m=2 and m=6.
    two = LayerStrategy(tp=1, dp=2)
    with pytest.raises(ValueError, match="micro-batches"):
        manual((1, 1, 1, 1, 1, 1, 1, 1), two, pp=4, virtual_stages=2, m=2)
    with pytest.raises(ValueError, match="micro-batches"):
        manual((1, 1, 1, 1, 1, 1, 1, 1), two, pp=4, virtual_stages=2, batch=24, m=6)
    assert manual((1, 1, 1, 1, 1, 1, 1, 1), two, pp=4, virtual_stages=2, m=8).num_micro_batches == 8
