"""Interleaved pipelines whose chunks differ, replayed chunk by chunk (cost.pipeline.chunked_pipeline_time)."""
import random

import pytest

from megatron_auto.cost.communication import pipeline_p2p_time
from megatron_auto.cost.estimate import (StageCost, dp_sync_window, estimate_plan, interleaved_chain_p2p,
                                         interleaved_iteration, stage_costs, stage_time_per_micro_batch,
                                         unequal_chunks)
from megatron_auto.cost.pipeline import chunked_pipeline_time, pipeline_time
from megatron_auto.cost.timeslice import StageLoad, simulate_iteration
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec


@pytest.mark.parametrize("stages, micro_batches, chunks, schedule", [
    (1, 3, 1, "1f1b"), (2, 4, 1, "1f1b"), (4, 2, 1, "1f1b"), (2, 4, 2, "1f1b"), (4, 8, 2, "1f1b"),
    (4, 8, 4, "1f1b"), (8, 16, 3, "1f1b"), (2, 6, 3, "1f1b"), (3, 4, 1, "gpipe")])
def test_equal_chunks_give_the_pipeline_formula(stages, micro_batches, chunks, schedule):
    forward, backward = 0.01, 0.02
    chunk_times = [[(forward / chunks, backward / chunks)] * chunks] * stages
    assert chunked_pipeline_time(chunk_times, micro_batches, schedule=schedule) == pytest.approx(
        pipeline_time([forward + backward] * stages, micro_batches, chunks))


@pytest.mark.parametrize("stages, micro_batches, chunks", [
    (2, 2, 2), (2, 8, 4), (4, 8, 3), (4, 16, 6), (6, 12, 16), (8, 8, 2)])
def test_a_transfer_delay_shows_on_the_interleaved_fill_and_drain_only(stages, micro_batches, chunks):
    """With overlap_p2p_comm no transfer holds up its sender; what the delay costs is the first micro-batch's
    forward through all p v chunks and the last one's backward back: 2 (p v - 1) hops whatever m, which
    cost.estimate.interleaved_chain_p2p charges (a hop longer than a chunk's compute shows in the steady state
    too: cost.pipeline.exposed_p2p_time charges that excess)."""
    forward, backward = 0.01, 0.02
    hop = forward / chunks / 2  # shorter than a chunk's compute, which hides it in the steady state
    chunk_times = [[(forward / chunks, backward / chunks)] * chunks] * stages
    ideal = pipeline_time([forward + backward] * stages, micro_batches, chunks)
    assert chunked_pipeline_time(chunk_times, micro_batches, hop_s=hop) == pytest.approx(
        ideal + 2 * (stages * chunks - 1) * hop)


def test_the_chain_enters_the_prediction_of_interleaved_plans_only():
    flags = dict(tp=2, pp=2, micro_batch_size=1, global_batch_size=32)
    interleaved = plan_from_flags(MODEL, 8, ManualParallelism(**flags, layers_per_virtual_stage=2))
    plain = plan_from_flags(MODEL, 8, ManualParallelism(**flags))
    samples = interleaved.global_batch_size // interleaved.num_micro_batches  # a micro-batch of every replica
    p2p = pipeline_p2p_time(MODEL.hidden_size, MODEL.seq_length, samples, 4, 2, CLUSTER, 2)
    assert stage_costs(interleaved, MODEL, CLUSTER, TRAINING)[0].chain_p2p_s == pytest.approx((2 * 4 - 1) * p2p)
    assert interleaved_chain_p2p(interleaved, p2p, 0.0) == 0.0  # cpu-gloo charges every transfer already
    assert all(stage.chain_p2p_s == 0.0 for stage in stage_costs(plain, MODEL, CLUSTER, TRAINING))
    assert estimate_plan(interleaved, MODEL, CLUSTER, TRAINING).breakdown.pp_comm_s >= (2 * 4 - 1) * p2p


def test_interleaved_gradient_syncs_run_beside_a_group_of_p_backwards_but_the_first_chunk_syncs_last():
    """Megatron-Core starts a chunk's gradient sync after its last micro-batch's backward, and the schedule runs
    each chunk's micro-batches in groups of p: the next chunk's group of p backwards hides it. The stage's first
    chunk syncs last."""
    flags = dict(tp=1, pp=2, micro_batch_size=1, global_batch_size=32)
    interleaved = plan_from_flags(MODEL, 8, ManualParallelism(**flags, layers_per_virtual_stage=4))
    assert dp_sync_window(interleaved) == 2
    assert dp_sync_window(plan_from_flags(MODEL, 8, ManualParallelism(**flags))) == 1
    stage = StageCost(sync_window_micro_batches=2)
    stage.add_dp_comm(0.010, 0.001)  # the first unit: nothing left to hide it
    stage.add_dp_comm(0.010, 0.004)  # 2 x 4 ms of backward hide 8 of its 10 ms
    assert stage.exposed_dp_s == pytest.approx(0.010 + 0.002)
    stage.sync_unhidden = True
    stage.add_dp_comm(0.010, 0.004)
    assert stage.exposed_dp_s == pytest.approx(0.022)


def test_one_micro_batch_walks_every_stage_forward_and_back_then_each_stage_its_tail():
    times = [[(1.0, 2.0)], [(3.0, 4.0)]]
    # F0 ends at 1, F1 at 4, B1 at 8, B0 at 10; the tails start when each stage is done.
    assert chunked_pipeline_time(times, 1) == 10.0
    assert chunked_pipeline_time(times, 1, tails=[0.5, 2.5]) == 10.5
    assert chunked_pipeline_time(times, 1, tails=[0.5, 3.0]) == 11.0


def test_it_agrees_with_the_time_sliced_replay_given_a_core_per_rank():
    """Two replays of the same schedule, one event-driven under processor sharing (cost.timeslice, with the
    chunks' weights), one by list scheduling: with a core for every rank nothing is shared, so they agree."""
    rng = random.Random(7)
    for _ in range(20):
        stages, chunks = rng.choice([2, 3, 4]), rng.choice([2, 3])
        micro_batches = stages * rng.randint(1, 3)
        weights = [[rng.uniform(0.3, 1.7) for _ in range(chunks)] for _ in range(stages)]
        forward, backward = 0.01, 0.03
        loads = [StageLoad(group=1, replicas=1, forward=(forward, 0.0), backward=(backward, 0.0), sync=0.0,
                           step_work=0.0, chunk_weights=tuple(w)) for w in weights]
        chunk_times = [[(forward * x, backward * x) for x in w] for w in weights]
        assert simulate_iteration(loads, micro_batches, chunks, cores=stages) == pytest.approx(
            chunked_pipeline_time(chunk_times, micro_batches))


MODEL = uniform_model("g", 16, 1024, 16, seq_length=1024, vocab_size=32000)
CLUSTER = CLUSTER_PRESETS["dgx-h100-80gb"].with_nodes(1)
TRAINING = TrainingSpec(global_batch_size=32)


def _plan(layout: str):
    flags = ManualParallelism(tp=2, pp=2, micro_batch_size=1, global_batch_size=32, pipeline_layout=layout)
    return plan_from_flags(MODEL, 8, flags)


def test_a_long_chunk_that_makes_its_neighbour_wait_lengthens_the_iteration():
    """Stage 0 holds chunks of 7 and 1 layers, stage 1 of 1 and 7: each stage's total is the formula's equal
    8 layers, but stage 1 waits on stage 0's long first chunk and stage 0 on stage 1's long last one."""
    plan = _plan("Et*7|t|t|t*7L")
    assert unequal_chunks(plan) and not unequal_chunks(_plan("Et*4|t*4|t*4|t*4L"))
    stages = stage_costs(plan, MODEL, CLUSTER, TRAINING)
    m = plan.num_micro_batches
    formula = pipeline_time([stage_time_per_micro_batch(s, m) for s in stages], m, plan.virtual_stages)
    replayed = interleaved_iteration(stages, m, plan.schedule)
    assert round(replayed / formula - 1, 3) == 0.068  # docs/cost_model.md, section 5
    assert estimate_plan(plan, MODEL, CLUSTER, TRAINING).iteration_time_s == pytest.approx(replayed)
    # The chunks of a stage are timed as priced: the embedding rides on the first, the LM head on the last.
    assert [round(s.chunk_s[0] / s.chunk_s[1], 1) for s in stages][0] > 6


def test_where_the_replay_is_shorter_the_formula_stays():
    """Stage 0 holds 5 + 5 layers, stage 1 3 + 3: the slow stage never waits, and the fast one's fill and drain
    overlap more than the formula's (sum T - T_max) / v. pipeline_time stays the floor, which the search's
    bounds rely on (cost.estimate.iteration_and_bubble)."""
    plan = _plan("Et*5|t*3|t*5|t*3L")
    stages = stage_costs(plan, MODEL, CLUSTER, TRAINING)
    m = plan.num_micro_batches
    formula = pipeline_time([stage_time_per_micro_batch(s, m) for s in stages], m, plan.virtual_stages)
    assert interleaved_iteration(stages, m, plan.schedule) < 0.99 * formula
    assert estimate_plan(plan, MODEL, CLUSTER, TRAINING).iteration_time_s == pytest.approx(formula)


def test_the_straggler_replans_uneven_chunks_do_not_explain_its_measured_gap():
    """benchmarks.bench_stragglers' interleaved re-plan (5, 5, 2, 4 layers in 2 chunks per stage, rank 2 at half
    speed; docs/cost_model.md section 15): the replay comes out shorter than the formula (2.21 s against 2.29 s),
    so the formula's price stands, while the run measured the split slower than its one-chunk form."""
    from megatron_auto.runtime.planning import cluster_for_world
    from megatron_auto.specs.presets import with_node_speeds

    model = uniform_model("g", 16, 128, 4, seq_length=128, vocab_size=512)
    four_nodes = cluster_for_world(CLUSTER_PRESETS["cpu-gloo"], 4, 1)  # four single-rank torchrun agents
    cluster = with_node_speeds(four_nodes, (1.0, 1.0, 0.5, 1.0))
    flags = ManualParallelism(pp=4, micro_batch_size=2, global_batch_size=16,
                              pipeline_layout="Et*3|t*3|t|t*2|t*2|t*2|t|t*2L")
    plan = plan_from_flags(model, 4, flags)
    training = TrainingSpec(global_batch_size=16)
    stages = stage_costs(plan, model, cluster, training)
    m = plan.num_micro_batches
    formula = pipeline_time([stage_time_per_micro_batch(s, m) for s in stages], m, plan.virtual_stages)
    replayed = interleaved_iteration(stages, m, plan.schedule)
    assert (round(replayed, 2), round(formula, 2)) == (2.21, 2.29)
    assert estimate_plan(plan, model, cluster, training).iteration_time_s == pytest.approx(formula)
