"""Rank groups of hybrid plans: golden lists, no process started."""
from __future__ import annotations

from megatron_auto.plan import Chunk, LayerStrategy, Plan
from megatron_auto.runtime.hybrid import groups
from megatron_auto.runtime.hybrid.segments import chunk_segments

TP4 = LayerStrategy(tp=4, sp=True)
TP2DP2 = LayerStrategy(tp=2, dp=2, sp=True, zero=1)
DP4 = LayerStrategy(dp=4, zero=1)


def plan(chunks, embedding, world=4, batch=8, micro_batches=2) -> Plan:
    return Plan(space="hybrid", world_size=world, pipeline_parallel=len(chunks), global_batch_size=batch,
                num_micro_batches=micro_batches, chunks=tuple(Chunk(tuple(c)) for c in chunks), embedding=embedding)


def test_tp_and_dp_groups_follow_megatron_order():
    layout = groups.StageLayout(stage=1, gpus=8, tp=2)
    assert groups.tp_groups(layout) == [(8, 9), (10, 11), (12, 13), (14, 15)]
    assert groups.dp_groups(layout) == [(8, 10, 12, 14), (9, 11, 13, 15)]


def test_regroup_groups_hold_the_sub_batches_of_one_coarse_chunk():
    assert groups.regroup_groups(0, 4, 4, 2) == [(0, 2), (1, 3)]
    assert groups.regroup_groups(0, 4, 1, 4) == [(0, 1, 2, 3)]
    assert groups.regroup_groups(0, 8, 4, 1) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert groups.regroup_groups(1, 8, 2, 8) == [(8, 10, 12, 14), (9, 11, 13, 15)]
    assert [groups.regroup_index(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]


def test_groups_of_tp4_then_tp2dp2_plan():
    p = plan([[TP4, TP4, TP2DP2, TP2DP2]], TP2DP2)
    roles = groups.plan_groups(p, seq_length=32)
    assert roles["tp"] == [(0, 1), (2, 3), (0, 1, 2, 3)]
    assert roles["dp"] == [(0, 2), (1, 3), (0,), (1,), (2,), (3,)]
    assert roles["regroup"] == [(0, 2), (1, 3)]
    assert groups.unique_groups(p, 32) == [(0, 1), (0, 2), (1, 3), (2, 3), (0, 1, 2, 3)]


def test_pipeline_boundary_is_batch_split_when_it_can_be():
    p = plan([[TP4, TP4], [DP4, DP4]], TP2DP2, world=8, batch=8)
    assert groups.boundary_strategy(p, 32) == LayerStrategy(tp=1, dp=4)
    odd = plan([[TP4, TP4], [TP4, TP4]], TP4, world=8, batch=4, micro_batches=2)
    assert groups.boundary_strategy(odd, 32) == LayerStrategy(tp=4, dp=1, sp=True)


def test_transition_pairs_cover_embedding_and_boundaries():
    p = plan([[TP4, TP4], [DP4, DP4]], TP2DP2, world=8, batch=8)
    boundary = LayerStrategy(tp=1, dp=4)
    assert groups.transition_pairs(p, 32) == [
        (0, TP2DP2, TP4), (0, TP4, TP4), (0, TP4, boundary),
        (1, boundary, DP4), (1, DP4, DP4), (1, DP4, TP2DP2)]


def test_segments_split_on_strategy_changes_including_recompute():
    full = LayerStrategy(tp=4, sp=True, recompute="full")
    p = plan([[TP4, full, full, TP2DP2]], TP2DP2)
    assert [(s.first, s.count, s.strategy) for s in chunk_segments(p, 0)] == [
        (0, 1, TP4), (1, 2, full), (3, 1, TP2DP2)]


def test_group_count_of_a_64_gpu_hybrid_plan():
    """8 stages of 8 GPUs, each stage mixing tp8, tp4xdp2 and tp1xdp8 layers (reported in docs)."""
    tp8, tp4, dp8 = LayerStrategy(tp=8, sp=True), LayerStrategy(tp=4, dp=2, sp=True, zero=1), LayerStrategy(dp=8, zero=1)
    p = plan([[tp8, tp4, dp8]] * 8, tp4, world=64, batch=64, micro_batches=8)
    unique = groups.unique_groups(p, 2048)
    # Per stage: one 8-rank group (tp8 = DP of dp8 = every regroup with tp1), two tp4 groups and
    # four 2-rank groups (DP of tp4 = regroup tp8<->tp4): 7 communicators a stage.
    assert len(unique) == 8 * 7
    assert sorted({len(g) for g in unique}) == [2, 4, 8]
