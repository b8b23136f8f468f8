"""The flex dispatcher's per-node deduplication (cost/flex_dispatch.py) and --overlap-moe-expert-parallel-comm's
merged steps (cost/ep_overlap.py), against values computed by hand or by enumeration, and through the CLI."""
from __future__ import annotations

import json
from dataclasses import replace
from itertools import combinations
from math import comb
from types import SimpleNamespace

import pytest

from megatron_auto.cli.job import load_job
from megatron_auto.cli.main import main
from megatron_auto.cli.parser import parse_args
from megatron_auto.cost.estimate import unmerged_ep_seconds
from megatron_auto.cost.ep_overlap import exposed_steady_state, hidden_ep_seconds
from megatron_auto.cost.flex_dispatch import flex_all_to_all_time, node_reach_probability
from megatron_auto.cost.layer_cost import dense_part_cost, layer_cost
from megatron_auto.cost.communication import group_all_to_all_time
from megatron_auto.cost.moe import dispatch_time, expert_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import MoESpec
from megatron_auto.specs.training import TrainingSpec
from test_moe_cost import B, BF16, LAYER, S, SHARED, TOY

FLEX = replace(BF16, moe_token_dispatcher="flex")
OVERLAP = replace(BF16, moe_ep_overlap=True)
EP16 = LayerStrategy(tp=1, dp=16, ep=16)  # over both nodes of TOY
WIDE = replace(LAYER, moe=replace(LAYER.moe, num_experts=16))
WIDE_SHARED = replace(SHARED, moe=replace(SHARED.moe, num_experts=16))
ESTIMATE = ["estimate", "--model", "deepseek-moe-16b", "--cluster", "dgx-h100-80gb", "--num-nodes", "4",
            "--global-batch-size", "256", "--tp", "1", "--ep", "16", "--micro-batch-size", "1"]  # EP over 2 nodes


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("experts, topk, nodes", [(4, 2, 2), (8, 2, 4), (12, 3, 3), (16, 4, 2)])
def test_node_reach_is_the_share_of_expert_choices_that_touch_the_node(experts, topk, nodes):
    """Every set of k distinct experts equally likely; node 0 holds the first E / nodes."""
    per_node = experts // nodes
    choices = list(combinations(range(experts), topk))
    touching = sum(any(expert < per_node for expert in choice) for choice in choices)
    assert node_reach_probability(MoESpec(num_experts=experts, router_topk=topk), nodes) == approx(
        touching / len(choices))


def test_group_limited_routing_reaches_a_node_only_through_a_chosen_group():
    """DeepSeek-V3: 256 experts in 8 groups, 4 groups a token, EP over 8 nodes (a group per node): a node is
    reached with probability 4/8, below the 1 - C(224, 8)/C(256, 8) of unlimited routing."""
    limited = MoESpec(num_experts=256, router_topk=8, router_num_groups=8, router_group_topk=4)
    assert node_reach_probability(limited, 8) == approx(0.5)
    unlimited = replace(limited, router_num_groups=0, router_group_topk=0)
    assert node_reach_probability(unlimited, 8) == approx(1 - comb(224, 8) / comb(256, 8))
    assert node_reach_probability(limited, 16) == approx(node_reach_probability(unlimited, 16))  # no alignment


def test_group_limited_routing_is_checked_as_megatron_checks_it():
    with pytest.raises(ValueError, match="0 < group_topk <= num_groups"):
        MoESpec(num_experts=8, router_topk=2, router_num_groups=4, router_group_topk=5)
    with pytest.raises(ValueError, match="do not form 3 groups"):
        MoESpec(num_experts=8, router_topk=2, router_num_groups=3, router_group_topk=1)


def test_flex_sends_a_token_once_per_node_it_reaches():
    """EP16 over 2 nodes of 8: alltoall sends k copies, half of them off the node; flex sends each token once
    to the other node when one of its experts is there, then spreads the copies over NVLink."""
    tokens = 1e8
    moe = WIDE.moe
    remote = tokens * node_reach_probability(moe, 2) / TOY.inter_node.effective_bandwidth + TOY.inter_node.latency_s
    local = moe.router_topk * tokens * 7 / 8 / TOY.intra_node.effective_bandwidth + TOY.intra_node.latency_s
    assert flex_all_to_all_time(tokens, moe, 16, 1, TOY) == approx(max(remote, local))
    assert flex_all_to_all_time(tokens, moe, 16, 1, TOY) < group_all_to_all_time(moe.router_topk * tokens, 16, 1, TOY)


def test_flex_inside_one_node_moves_what_alltoall_moves():
    inside = LayerStrategy(tp=1, dp=8, ep=8)
    assert dispatch_time(LAYER, S, B, inside, TOY, FLEX) == approx(dispatch_time(LAYER, S, B, inside, TOY, BF16))
    assert dispatch_time(WIDE, S, B, EP16, TOY, FLEX) < dispatch_time(WIDE, S, B, EP16, TOY, BF16)


def test_merged_step_exposes_what_each_phase_cannot_cover():
    assert exposed_steady_state(1.0, (0.25, 2.0), (0.5, 1.0)) == approx(0.75 + 0.5 + 0.0)
    assert exposed_steady_state(1.0, (3.0, 3.0), (3.0, 3.0)) == 0.0
    assert exposed_steady_state(1.0, (0.0, 0.0), (0.0, 0.0)) == approx(4.0)  # nothing to hide behind


@pytest.mark.parametrize("layer", [WIDE, WIDE_SHARED])
def test_overlap_takes_the_hidden_seconds_off_the_dispatch_and_nothing_else(layer):
    plain, overlapped = (layer_cost(layer, EP16, B, S, TOY, t) for t in (BF16, OVERLAP))
    experts = expert_cost(layer, EP16, B, S, TOY, OVERLAP)
    hidden = plain.ep_comm_s - overlapped.ep_comm_s
    assert 0 < hidden <= experts.comm_s * (1 + 1e-12)
    assert overlapped.ep_hidden_s == hidden
    assert replace(overlapped, ep_comm_s=plain.ep_comm_s, ep_hidden_s=0.0) == plain
    dense = dense_part_cost(layer, EP16, B, S, TOY, OVERLAP)
    assert hidden == approx(hidden_ep_seconds(layer, EP16, B, S, TOY, OVERLAP, (dense.forward_s, dense.backward_s),
                                              (experts.forward_s, experts.backward_s), experts.comm_s / 2))


@pytest.mark.parametrize("strategy, cluster", [
    (LayerStrategy(tp=1, dp=16, ep=1), TOY),                    # Megatron-Core refuses ep 1
    (replace(EP16, recompute="full"), TOY),                     # and full recomputation
    (EP16, replace(TOY, grad_overlap=0.0)),                     # a cluster that overlaps nothing (cpu-gloo)
])
def test_overlap_hides_nothing_where_it_does_not_run(strategy, cluster):
    assert layer_cost(WIDE, strategy, B, S, cluster, OVERLAP) == layer_cost(WIDE, strategy, B, S, cluster, BF16)


@pytest.mark.parametrize("pp, v, m, stage, steps", [
    (1, 1, 8, 0, 1),     # without pipelining the first forward and the last backward run alone
    (4, 2, 16, 0, 11),   # (4 - 0 - 1) x 2 + (2 - 1) x 4 warm-up chunk forwards, plus the extra one
    (4, 2, 16, 3, 5),
    (4, 2, 2, 0, 4),     # capped at the m x v chunk steps there are
])
def test_unmerged_steps_show_what_a_merged_step_hides(pp, v, m, stage, steps):
    plan = SimpleNamespace(pipeline_parallel=pp, virtual_stages=v, num_micro_batches=m)
    assert unmerged_ep_seconds(2.0, plan, stage) == approx(2.0 * steps / v)
    assert unmerged_ep_seconds(0.0, plan, stage) == 0.0


def _estimate_json(capsys, *extra):
    assert main([*ESTIMATE, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("layout", [("--pp", "1"), ("--pp", "2", "--virtual-stages", "2")])
def test_the_combined_schedule_holds_one_layer_more_not_a_micro_batch(capsys, layout):
    """Megatron-Core's merged step pairs layer i's forward with layer L-1-i's backward and frees each backward
    layer as it goes (model_chunk_schedule_plan.py, release_state): the new micro-batch's layers replace the old
    one's, so the peak holds the warm-up's chunks and one layer more, where it once held a whole micro-batch more.
    The extra is the largest layer's kept bytes: deepseek-moe-16b's MoE layers, above its one dense layer."""
    plain = _estimate_json(capsys, *layout)
    merged = _estimate_json(capsys, *layout, "--overlap-moe-expert-parallel-comm")
    extra_gib = merged["memory_breakdown"]["activations_gib"] - plain["memory_breakdown"]["activations_gib"]
    model, cluster, training = load_job(parse_args([*ESTIMATE, "--overlap-moe-expert-parallel-comm"]))
    moe_layer = next(layer for layer in model.layers if layer.moe is not None)
    strategy = LayerStrategy(tp=1, dp=32 // int(layout[1]), ep=16)  # ESTIMATE: 4 nodes of 8
    one_layer = layer_cost(moe_layer, strategy, 1, model.seq_length, cluster, training).activation_bytes
    assert extra_gib * 2**30 == pytest.approx(one_layer, rel=1e-9)
    assert extra_gib < 0.1 * plain["memory_breakdown"]["activations_gib"]  # 28 layers: far below a micro-batch


@pytest.mark.parametrize("spec, message", [
    (dict(moe_token_dispatcher="allgather"), "alltoall or flex"),
    (dict(moe_shared_expert_overlap=True), "exclude each other"),
    (dict(precision="fp32", param_bytes=4), "16-bit"),
])
def test_training_spec_refuses_what_megatron_refuses(spec, message):
    with pytest.raises(ValueError, match=message):
        TrainingSpec(global_batch_size=8, moe_ep_overlap=True, **spec)


def test_estimate_prices_both_knobs_and_keeps_the_plan(capsys):
    times = []
    overlap = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    for extra in ([], ["--moe-token-dispatcher-type", "flex"], overlap):
        extra = ["--pp", "1", *extra]
        assert main([*ESTIMATE, *extra, "--json"]) == 0
        times.append(capsys.readouterr().out)
    assert len(set(times)) == 3
    assert '"flex"' in times[1] and "--overlap-moe-expert-parallel-comm" in times[2]  # the plan's flags run them
    assert "--overlap-moe-expert-parallel-comm" not in times[0] + times[1]


@pytest.mark.parametrize("flags, message", [
    (["--overlap-moe-expert-parallel-comm", "--pp", "2", "--virtual-stages", "1"], "virtual pipeline stages"),
    (["--overlap-moe-expert-parallel-comm", "--pp", "1", "--recompute", "full"], "full recomputation"),
    (["--delay-wgrad-compute", "--pp", "1"], "needs --overlap-moe-expert-parallel-comm"),
    (["--overlap-moe-expert-parallel-comm", "--pp", "1", "--moe-token-dispatcher-type", "allgather"],
     "alltoall or flex"),
])
def test_overlap_refusals_are_one_line_and_exit_2(capsys, flags, message):
    assert main([*ESTIMATE, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_the_search_leaves_out_full_recomputation_under_ep_overlap_as_megatron_refuses_it():
    """The rule the megatron space drops (ep > 1, full recompute) on rests on build_uniform_plan's refusal; the
    search still finds a plan, and none of its layers is fully recomputed."""
    from megatron_auto.errors import UserError
    from megatron_auto.search import search_plan
    from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
    from megatron_auto.specs import load_cluster, load_model

    model, cluster = load_model("tiny-deepseek-moe"), load_cluster("dgx-h100-80gb", 1)
    training = TrainingSpec(64, moe_ep_overlap=True)
    refused = UniformConfig(tp=1, pp=1, micro_batch_size=1, distributed_optimizer=True, recompute="full",
                            ep=2)
    with pytest.raises(UserError, match="full recomputation"):
        build_uniform_plan(model, cluster, training, refused)
    result = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    assert dict(result.pruning).get("ep-overlap-without-full-recompute", 0) > 0
    assert all(layer.recompute != "full" for chunk in result.plan.chunks for layer in chunk.layers)


def test_the_hybrid_space_refuses_ep_overlap_in_one_line(capsys):
    """The hybrid runtime runs its own schedule, not the combined 1F1B one whose merged steps the megatron space
    prices (cost/ep_overlap.py, cost.estimate.merged_step_extra_bytes)."""
    argv = ["plan", "--model", "tiny-mixtral", "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
            "--global-batch-size", "64", "--space", "hybrid", "--overlap-moe-expert-parallel-comm"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "hybrid space does not plan" in err and "\n" not in err
    assert main(argv[:-1]) == 0  # the same job without the flag plans in the hybrid space


PLAN = ["plan", "--model", "deepseek-moe-16b", "--cluster", "dgx-h100-80gb", "--num-nodes", "4",
        "--global-batch-size", "256", "--json"]


def test_plan_weighs_ep_overlap_under_search_and_keeps_the_faster_plan(capsys):
    """`--overlap-moe-expert-parallel-comm search`: the search runs without it, then with it on top of the best
    spec so far (search.plan_search's switches), and keeps the faster plan; its flags say which."""
    plans = {}
    for choice in ("off", "on", "search"):
        assert main([*PLAN, "--overlap-moe-expert-parallel-comm", choice]) == 0
        plans[choice] = json.loads(capsys.readouterr().out)
    best = min(plans["off"]["iteration_time_s"], plans["on"]["iteration_time_s"])
    assert plans["search"]["iteration_time_s"] == best
    chosen = plans["on"]["iteration_time_s"] < plans["off"]["iteration_time_s"]
    assert ("--overlap-moe-expert-parallel-comm" in plans["search"]["megatron_flags"]) == chosen
    assert chosen  # deepseek-moe-16b on 4 nodes: its EP 8 dispatch hides behind the merged steps' compute


@pytest.mark.parametrize("argv, message", [
    ([*ESTIMATE, "--overlap-moe-expert-parallel-comm", "search"], "search is plan's choice"),
    ([*PLAN, "--overlap-moe-expert-parallel-comm", "search", "--space", "hybrid"], "hybrid space does not plan"),
    ([*PLAN, "--overlap-moe-expert-parallel-comm", "search", "--moe-token-dispatcher-type", "allgather"],
     "alltoall or flex"),
])
def test_ep_overlap_search_refusals_are_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
