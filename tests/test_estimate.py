"""estimate_plan: properties that must hold whatever the constants, and bad jobs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.communication import dp_comm_time
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.flops import model_flops_per_iteration
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.errors import UserError
from megatron_auto.plan import Chunk, LayerStrategy, Plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import GIB, TrainingSpec

MODEL = MODEL_PRESETS["gpt3-1.7b"]            # 24 layers, h=2304, 24 heads
NODE = CLUSTER_PRESETS["dgx-a100-80gb"]       # 1 node x 8 A100
TRAINING = TrainingSpec(global_batch_size=32)


def predict(cluster=NODE, training=TRAINING, model=MODEL, **config):
    config = {"tp": 2, "pp": 2, "micro_batch_size": 2, **config}
    plan = build_uniform_plan(model, cluster, training, UniformConfig(**config))
    return plan, estimate_plan(plan, model, cluster, training)


def test_more_recomputation_means_less_memory_and_more_time():
    results = [predict(recompute=kind)[1] for kind in ("none", "selective", "full")]
    memory = [r.peak_memory_gib for r in results]
    times = [r.iteration_time_s for r in results]
    assert memory[0] > memory[1] > memory[2]
    assert times[0] < times[1] < times[2]


def test_full_recompute_costs_one_extra_forward_per_layer():
    plan, prediction = predict(recompute="full")
    strategy = plan.layer_strategies[0]
    cost = layer_cost(MODEL.layers[0], strategy, plan.local_micro_batch(strategy), MODEL.seq_length, NODE, TRAINING)
    assert cost.recompute_s == pytest.approx(cost.forward_s)
    # 12 layers per stage x m=8 micro-batches on the critical stage.
    assert prediction.breakdown.recompute_s == pytest.approx(8 * 12 * cost.recompute_s, rel=1e-9)


def test_block_recompute_lies_between_none_and_full():
    none, some, full = (predict(recompute="full", recompute_num_layers=n)[1] for n in (0, 6, None))
    assert none.peak_memory_gib > some.peak_memory_gib > full.peak_memory_gib
    assert none.iteration_time_s < some.iteration_time_s < full.iteration_time_s


def test_sequence_parallel_saves_memory():
    for kind in ("none", "selective", "full"):
        plain = predict(recompute=kind)[1]
        sp = predict(recompute=kind, sequence_parallel=True)[1]
        assert sp.peak_memory_gib < plain.peak_memory_gib


def test_distributed_optimizer_saves_memory():
    plain = predict(tp=2, pp=1, micro_batch_size=2)[1]
    sharded = predict(tp=2, pp=1, micro_batch_size=2, distributed_optimizer=True)[1]
    # dp=4: optimizer states 12 B/param shrink to 3 B/param: about 9/18 of the model states saved.
    assert sharded.peak_memory_gib < plain.peak_memory_gib
    states_gib = 18 * MODEL.num_parameters / 2 / GIB
    assert plain.peak_memory_gib - sharded.peak_memory_gib == pytest.approx(states_gib * 9 / 18, rel=0.02)


def test_more_data_parallelism_with_the_same_per_gpu_work_is_not_slower_per_sample():
    per_sample, compute = [], []
    for gpus in (1, 2, 4, 8):
        cluster = replace(NODE, gpus_per_node=gpus)
        training = TrainingSpec(global_batch_size=4 * gpus)  # micro-batch 2 per GPU, 2 micro-batches
        _, prediction = predict(cluster, training, tp=1, pp=1, micro_batch_size=2)
        per_sample.append(prediction.iteration_time_s / training.global_batch_size)
        compute.append(prediction.breakdown.compute_s)
    assert compute == pytest.approx([compute[0]] * 4, rel=1e-12)
    assert all(later <= earlier for earlier, later in zip(per_sample, per_sample[1:]))
    assert per_sample[-1] < per_sample[0]


def test_interleaving_shrinks_the_bubble():
    plain = predict(pp=2, micro_batch_size=1)[1]
    interleaved = predict(pp=2, micro_batch_size=1, vp=4)[1]
    assert interleaved.breakdown.bubble_s < plain.breakdown.bubble_s
    assert interleaved.iteration_time_s < plain.iteration_time_s


def test_tflops_per_gpu_is_model_flops_over_time_and_gpus():
    plan, prediction = predict(recompute="full")
    flops = model_flops_per_iteration(MODEL, 32)
    assert prediction.tflops_per_gpu == pytest.approx(flops / prediction.iteration_time_s / 8 / 1e12, rel=1e-12)
    # Recomputation is not model FLOPs: the same plan without it reports more TFLOP/s.
    assert predict()[1].tflops_per_gpu > prediction.tflops_per_gpu
    assert 0 < prediction.tflops_per_gpu < 312


def test_iteration_covers_every_stage_and_memory_covers_every_stage():
    _, prediction = predict(tp=1, pp=4, micro_batch_size=1)
    assert len(prediction.stage_time_s) == len(prediction.stage_memory_gib) == 4
    assert prediction.iteration_time_s >= max(prediction.stage_time_s)
    assert prediction.peak_memory_gib == max(prediction.stage_memory_gib)
    assert prediction.breakdown.bubble_s > 0


def test_budget_decides_fits():
    roomy = predict()[1]
    # The default budget: the GPU's capacity less the cluster's safety margin.
    margin = CLUSTER_PRESETS["dgx-a100-80gb"].memory_margin
    assert roomy.fits and roomy.memory_budget_gib == pytest.approx(80.0 * (1 - margin))
    # fits compares the device memory (allocated peak + allocator reserve + CUDA context + NCCL).
    assert roomy.device_memory_gib > roomy.peak_reserved_gib > roomy.peak_memory_gib
    just = TrainingSpec(global_batch_size=32, memory_budget_bytes=int(roomy.device_memory_gib * GIB) + 1,
                        memory_margin=0.0)
    assert predict(training=just)[1].fits
    tight = TrainingSpec(global_batch_size=32, memory_budget_bytes=int(roomy.device_memory_gib * GIB) - 1,
                         memory_margin=0.0)
    squeezed = predict(training=tight)[1]
    assert not squeezed.fits
    assert squeezed.peak_memory_gib == pytest.approx(roomy.peak_memory_gib)


def test_estimate_is_deterministic():
    assert predict(recompute="selective")[1] == predict(recompute="selective")[1]


def test_the_last_gradient_bucket_cannot_hide():
    # p=1, dp=8: the embedding's gradients are produced last, so its all-reduce is exposed in full.
    plan, prediction = predict(tp=1, pp=1, micro_batch_size=4)
    embedding_sync = dp_comm_time(MODEL.embedding_parameters, plan.embedding, NODE, TRAINING)
    assert embedding_sync > 0
    assert prediction.breakdown.dp_comm_s >= embedding_sync


def test_hybrid_layout_change_costs_a_transition():
    a, b = LayerStrategy(tp=2, dp=4), LayerStrategy(tp=8, dp=1)
    layers = (a,) * 12 + (b,) * 12
    plan = Plan(space="hybrid", world_size=8, pipeline_parallel=1, global_batch_size=32, num_micro_batches=8,
                chunks=(Chunk(layers),), embedding=a)
    prediction = estimate_plan(plan, MODEL, NODE, TRAINING)
    assert prediction.breakdown.transition_s > 0
    uniform = replace(plan, chunks=(Chunk((a,) * 24),))
    assert estimate_plan(uniform, MODEL, NODE, TRAINING).breakdown.transition_s == 0.0


def test_world_size_mismatch_raises():
    plan, _ = predict()
    with pytest.raises(UserError, match="plan is for 8 GPUs but the cluster has 16"):
        estimate_plan(plan, MODEL, NODE.with_nodes(2), TRAINING)


def test_layer_count_mismatch_raises():
    plan, _ = predict()
    with pytest.raises(UserError, match="plan places 24 layers"):
        estimate_plan(plan, MODEL_PRESETS["gpt3-3.6b"], NODE, TRAINING)


def test_global_batch_mismatch_raises():
    plan, _ = predict()
    with pytest.raises(UserError, match="global batch 32"):
        estimate_plan(plan, MODEL, NODE, TrainingSpec(global_batch_size=64))


def test_heads_not_divisible_by_tp_raises():
    six_heads = uniform_model("six-heads", 4, 96, 6, seq_length=64, vocab_size=512)
    strategy = LayerStrategy(tp=4, dp=2)
    plan = Plan(space="megatron", world_size=8, pipeline_parallel=1, global_batch_size=32, num_micro_batches=4,
                chunks=(Chunk((strategy,) * 4),), embedding=strategy)  # no model attached: not caught by Plan
    with pytest.raises(UserError, match=r"tp=4 does not divide the attention heads \(6\)"):
        estimate_plan(plan, six_heads, NODE, TRAINING)
