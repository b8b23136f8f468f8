"""--moe-shared-expert-overlap in the cost model (cost/shared_expert.py), against values computed by hand,
and through the flags and CLI that set it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.communication import tp_comm_time
from megatron_auto.cost.compute import module_forward_shares
from megatron_auto.cost.layer_cost import dense_part_cost, layer_cost
from megatron_auto.cost.moe import expert_cost
from megatron_auto.cost.shared_expert import hidden_dispatch_seconds, shared_expert_seconds
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.training import TrainingSpec
from test_moe_cost import B, BF16, LAYER, S, SHARED, TOY, TP2_EP2

OVERLAP = replace(BF16, moe_shared_expert_overlap=True)


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_shared_expert_work_is_its_mlp_share_of_the_passes_and_half_the_tp_collectives():
    dense = dense_part_cost(SHARED, TP2_EP2, B, S, TOY, OVERLAP)
    passes = dense.forward_s + dense.backward_s + dense.recompute_s
    share = module_forward_shares(SHARED, S, B, 2, True, TOY, 2, OVERLAP.attention_backend)[0]
    expected = share * passes + tp_comm_time(SHARED.hidden_size, S, B, TP2_EP2, TOY, 2) / 2
    assert shared_expert_seconds(SHARED, TP2_EP2, B, S, TOY, OVERLAP, passes) == approx(expected)
    assert 0 < share < 1


@pytest.mark.parametrize("strategy", [TP2_EP2, LayerStrategy(tp=1, dp=16, ep=8),
                                      LayerStrategy(tp=1, dp=16, ep=8, recompute="full")])
def test_overlap_hides_the_shorter_of_the_shared_expert_and_the_dispatch(strategy):
    plain, overlapped = (layer_cost(SHARED, strategy, B, S, TOY, t) for t in (BF16, OVERLAP))
    dense = dense_part_cost(SHARED, strategy, B, S, TOY, OVERLAP)
    dispatch = expert_cost(SHARED, strategy, B, S, TOY, OVERLAP).comm_s
    shared = shared_expert_seconds(SHARED, strategy, B, S, TOY, OVERLAP,
                                   dense.forward_s + dense.backward_s + dense.recompute_s)
    assert plain.ep_comm_s - overlapped.ep_comm_s == approx(min(shared, dispatch))
    assert overlapped.ep_comm_s >= 0 and overlapped.micro_batch_s < plain.micro_batch_s
    assert replace(overlapped, ep_comm_s=plain.ep_comm_s) == plain  # nothing else moves


def test_overlap_hides_nothing_without_a_shared_expert_or_on_a_cluster_that_overlaps_nothing():
    assert layer_cost(LAYER, TP2_EP2, B, S, TOY, OVERLAP) == layer_cost(LAYER, TP2_EP2, B, S, TOY, BF16)
    serial = replace(TOY, grad_overlap=0.0)
    assert layer_cost(SHARED, TP2_EP2, B, S, serial, OVERLAP) == layer_cost(SHARED, TP2_EP2, B, S, serial, BF16)
    assert hidden_dispatch_seconds(SHARED, LayerStrategy(tp=1, dp=16), B, S, TOY, OVERLAP, 1.0, 1.0) == 0.0


def test_overlap_needs_the_alltoall_dispatcher():
    with pytest.raises(ValueError, match="only works with the alltoall token dispatcher"):
        TrainingSpec(global_batch_size=8, moe_token_dispatcher="allgather", moe_shared_expert_overlap=True)
