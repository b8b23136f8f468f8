"""Each MoE cost term (cost/moe.py and its place in layer_cost) against a value computed by hand.

Sources as in the code: Megatron-Core 0.16.1's MoELayer, token dispatchers and expert rank order; the
activated-FLOP count of Fedus et al. 2021 and Jiang et al. 2024; NCCL's all-to-all as grouped
send/receive; the ring formulas of shared/reference/hardware.md.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.collectives import all_gather_time, all_to_all_time, reduce_scatter_time
from megatron_auto.cost.communication import dp_comm_time, tp_comm_time
from megatron_auto.cost.compute import gemm_compute_time
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.flops import Gemm, layer_forward_flops, layer_gemms, moe_forward_flops
from megatron_auto.cost.layer_cost import dense_part_cost, layer_cost
from megatron_auto.cost.memory import layer_activation_bytes, model_state_bytes
from megatron_auto.cost.communication import group_all_to_all_time
from megatron_auto.cost.moe import (dispatch_time, expert_activation_bytes, expert_compute_times, expert_cost,
                                    expert_gemm_time, expert_gemms, expert_memory_bytes, expert_tokens,
                                    expert_view, local_tokens, router_gemm)
from megatron_auto.errors import UserError
from megatron_auto.plan import Chunk, LayerStrategy, Plan
from megatron_auto.specs import ClusterSpec, ComputeEfficiency, GpuSpec, LinkSpec
from megatron_auto.specs.model import LayerSpec, MoESpec, uniform_model
from megatron_auto.specs.training import GIB, TrainingSpec

# The toy cluster of test_cost_terms.py: intra-node 50 GB/s effective, 10 us per step; inter-node
# 10 GB/s effective, 20 us; 100 TFLOP/s; 1 TB/s HBM; the GEMM law with latency 5 us.
INTRA = LinkSpec(100e9, 1e-5, efficiency=0.5)
INTER = LinkSpec(10e9, 2e-5, efficiency=1.0)
TOY = ClusterSpec(name="toy", num_nodes=2, gpus_per_node=8, gpu=GpuSpec("toy", 80 * GIB, 100e12, 1e12),
                  intra_node=INTRA, inter_node=INTER, compute=ComputeEfficiency(0.8, 256.0, latency_s=5e-6))
BF16 = TrainingSpec(global_batch_size=8)
# A MoE layer: h=1024, 16 heads, 8 experts of f=2048 SwiGLU, top-2, no biases; s=512, b=2.
H, S, B, E, F, K = 1024, 512, 2, 8, 2048, 2
MOE = MoESpec(num_experts=E, router_topk=K, expert_ffn_hidden_size=F)
LAYER = LayerSpec(H, 16, 16, 4096, swiglu=True, normalization="RMSNorm", add_bias_linear=False, moe=MOE)
SHARED = replace(LAYER, moe=replace(MOE, shared_expert_ffn_hidden_size=1024))
EP4 = LayerStrategy(tp=1, dp=8, ep=4)
TP2_EP2 = LayerStrategy(tp=2, dp=4, sp=True, ep=2, etp=1)


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_all_to_all_moves_n_minus_1_over_n_with_one_latency():
    # 3/4 * 1e9 B / 50e9 B/s = 0.015 s plus one 10 us latency.
    assert all_to_all_time(1e9, 4, INTRA) == approx(0.015 + 1e-5)
    assert all_to_all_time(1e9, 1, INTRA) == 0.0


def test_moe_flops_count_the_router_and_k_experts_per_token():
    # Router 2 T h E; experts 2 T k (h 2F + F h) with SwiGLU.
    tokens = S * B
    expected = 2 * tokens * H * E + 2 * tokens * K * (H * 2 * F + F * H)
    assert moe_forward_flops(LAYER, tokens) == approx(expected)
    dense_part = sum(g.flops for g in layer_gemms(LAYER, S, B, tp=1))
    assert layer_forward_flops(LAYER, S, B) == approx(dense_part + expected)
    assert moe_forward_flops(replace(LAYER, moe=None), tokens) == 0.0


def test_dense_part_of_a_moe_layer_runs_the_shared_expert_only():
    assert len(layer_gemms(LAYER, S, B, tp=1)) == 4  # attention only: no shared expert
    fc1, fc2 = layer_gemms(SHARED, S, B, tp=2)[4:]
    assert (fc1.n, fc2.k) == (2 * 1024 // 2, 1024 // 2)


def test_tokens_per_gpu_follow_sp_top_k_etp_and_imbalance():
    assert local_tokens(S, B, EP4) == S * B
    assert local_tokens(S, B, TP2_EP2) == S * B / 2  # SP: a 1/tp sequence shard
    assert expert_tokens(LAYER, S, B, EP4, 1.0) == K * S * B
    etp2 = LayerStrategy(tp=2, dp=4, sp=True, ep=2)  # etp = tp = 2: the ETP group gathers 2 ranks' copies
    assert expert_tokens(LAYER, S, B, etp2, 1.3) == approx(K * S * B / 2 * 2 * 1.3)


def test_expert_gemms_split_tokens_over_local_experts_and_width_over_etp():
    fc1, fc2 = expert_gemms(LAYER, 2048.0, LayerStrategy(tp=2, dp=4, sp=True, ep=2))
    # 4 local experts, 512 tokens each; f / etp = 1024, doubled for SwiGLU's gate.
    assert fc1 == Gemm(512.0, H, 2048.0, batch=4)
    assert fc2 == Gemm(512.0, 1024.0, H, batch=4)
    # Per GPU, the experts' FLOPs are k T (h 3f) x 2 whatever ep and etp: the work spreads evenly.
    for strategy in (EP4, TP2_EP2, LayerStrategy(tp=2, dp=4, sp=True, ep=4)):
        tokens = expert_tokens(LAYER, S, B, strategy, 1.0)
        flops = sum(g.flops for g in expert_gemms(LAYER, tokens, strategy))
        assert flops == approx(2 * K * local_tokens(S, B, strategy) * 3 * H * F)


def test_router_gemm_is_tokens_by_hidden_by_experts():
    assert router_gemm(LAYER, S, B, TP2_EP2) == Gemm(S * B / 2, H, E)


def test_sequential_experts_pay_a_kernel_each_grouped_one():
    tiny = (Gemm(1.0, 8, 8, batch=4),)  # far below the 5 us latency
    assert expert_gemm_time(tiny, grouped=False, cluster=TOY) == approx(4 * 5e-6)
    assert expert_gemm_time(tiny, grouped=True, cluster=TOY) == approx(5e-6)
    big = (Gemm(4096.0, 4096, 4096, batch=2),)
    assert expert_gemm_time(big, False, TOY) == approx(gemm_compute_time(big[0], TOY))


def test_expert_memory_bound_bytes():
    # EP4, bf16: copies k T = 2048, processed 2048 (etp 1, balanced); f/etp = 2048. SwiGLU 5f and the
    # probability scaling 2f forward; 5f and 4f backward.
    forward, backward = expert_memory_bytes(LAYER, S, B, EP4, 2, 1.0)
    moved = 2 * (4 * H * 2048 + 4 * H * 2048)
    router = 3 * 4 * S * B * E
    assert forward == approx(moved + 2 * 2048 * 7 * F + router)
    grads = LAYER.expert_parameters / 4 * (2 + 8)
    assert backward == approx(moved + 2 * 2048 * 9 * F + router + grads)


def test_expert_compute_times_gemms_twice_in_backward():
    forward, backward = expert_compute_times(LAYER, S, B, EP4, TOY, BF16)
    tokens = expert_tokens(LAYER, S, B, EP4, 1.0)
    gemms = expert_gemm_time(expert_gemms(LAYER, tokens, EP4), False, TOY)
    gemms += gemm_compute_time(router_gemm(LAYER, S, B, EP4), TOY)
    fwd_bytes, bwd_bytes = expert_memory_bytes(LAYER, S, B, EP4, 2, 1.0)
    bandwidth = 1e12 * 0.7
    assert forward == approx(gemms + fwd_bytes / bandwidth)
    assert backward == approx(2 * gemms + bwd_bytes / bandwidth)


def test_grouped_experts_with_biases_add_the_fc2_bias_expert_by_expert():
    # TEGroupedMLP._apply_bias: per processed copy 6 h-wide words forward (product, sum, cat) and 8 backward
    # (two products and two reductions for b and p, the split's gradient concatenated). EP4, bf16: 2048 copies.
    grouped = replace(BF16, moe_grouped_gemm=True)
    biased = replace(LAYER, add_bias_linear=True)
    bandwidth = 1e12 * 0.7
    plain_forward, plain_backward = expert_compute_times(LAYER, S, B, EP4, TOY, grouped)
    forward, backward = expert_compute_times(biased, S, B, EP4, TOY, grouped)
    copy_words = 2 * 2048 * H
    assert forward - plain_forward == pytest.approx(6 * copy_words / bandwidth, rel=1e-9)
    # The biases' own gradients are added into their fp32 main_grad too (read new, read+write old).
    bias_grads = (biased.expert_parameters - LAYER.expert_parameters) / 4 * (2 + 8)
    assert backward - plain_backward == pytest.approx((8 * copy_words + bias_grads) / bandwidth, rel=1e-9)
    # SequentialMLP runs each expert's MLP with its own biases: no such pass, only the biases' gradients.
    sequential_forward, sequential_backward = expert_compute_times(biased, S, B, EP4, TOY, BF16)
    assert sequential_forward == approx(expert_compute_times(LAYER, S, B, EP4, TOY, BF16)[0])
    assert sequential_backward - expert_compute_times(LAYER, S, B, EP4, TOY, BF16)[1] == pytest.approx(
        bias_grads / bandwidth, rel=1e-9)


def test_the_routed_side_takes_the_host_floor_of_its_counted_ops():
    # HOST_OPS_ROUTED at 1 ms an op, far above the toy GPU's time: SequentialMLP repeats its ops for each of the
    # E/ep = 2 local experts, a grouped GEMM runs them as one expert's; the allgather dispatcher counts its own.
    launch = 1e-3
    slow_host = replace(TOY, gpu=replace(TOY.gpu, kernel_launch_s=launch))
    assert expert_compute_times(LAYER, S, B, EP4, slow_host, BF16) == (
        approx((51 + 11 * 2) * launch), approx((35 + 20 * 2) * launch))
    grouped = replace(BF16, moe_grouped_gemm=True)
    assert expert_compute_times(LAYER, S, B, EP4, slow_host, grouped) == (
        approx((51 + 11) * launch), approx((35 + 20) * launch))
    allgather = replace(BF16, moe_token_dispatcher="allgather")
    assert expert_compute_times(LAYER, S, B, EP4, slow_host, allgather) == (
        approx((42 + 11 * 2) * launch), approx((29 + 17 * 2) * launch))
    # Grouped experts with biases add TEGroupedMLP._apply_bias's per-expert ops.
    biased = replace(LAYER, add_bias_linear=True)
    assert expert_compute_times(biased, S, B, EP4, slow_host, grouped) == (
        approx((51 + 11 + 5 + 2 * 2) * launch), approx((35 + 20 + 6 + 7 * 2) * launch))
    # Without a host term the GPU's time stands.
    assert expert_compute_times(LAYER, S, B, EP4, TOY, BF16)[0] < 51 * launch


def test_graphs_take_the_routed_side_off_the_host():
    launch = 1e-3
    slow_host = replace(TOY, gpu=replace(TOY.gpu, kernel_launch_s=launch))
    router = replace(BF16, cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router",))
    forward, backward = expert_compute_times(LAYER, S, B, EP4, slow_host, router)
    assert (forward, backward) == (approx((51 + 22 - 16) * launch), approx((35 + 40 - 15) * launch))
    preprocess = replace(router, cuda_graph_scope=("moe_router", "moe_preprocess"))
    assert expert_compute_times(LAYER, S, B, EP4, slow_host, preprocess)[0] == approx((51 + 22 - 16 - 13) * launch)
    whole = replace(BF16, cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))
    assert expert_compute_times(LAYER, S, B, EP4, slow_host, whole) == expert_compute_times(LAYER, S, B, EP4, TOY,
                                                                                          whole)


def test_load_imbalance_slows_the_experts():
    balanced, _ = expert_compute_times(LAYER, S, B, EP4, TOY, BF16)
    skewed, _ = expert_compute_times(LAYER, S, B, EP4, TOY, replace(BF16, moe_load_imbalance=1.5))
    assert skewed > 1.3 * balanced


def test_alltoall_dispatch_two_all_to_alls_in_the_ep_group():
    # EP4 (ranks 1 apart, inside a node): each pass dispatches and combines k T h bytes: 2 x 4 MiB... here
    # k T h word = 2 * 1024 * 1024 * 2 = 4 MiB per GPU, over the intra-node link.
    received = K * S * B * H * 2
    assert dispatch_time(LAYER, S, B, EP4, TOY, BF16) == approx(2 * all_to_all_time(received, 4, INTRA))


def test_alltoall_dispatch_across_nodes_and_with_expert_tp():
    # ep 8 with etp 2: the EP group's ranks are 2 apart and span 16 GPUs, 4 in each node: 3/8 of each rank's
    # bytes cross NVLink (50 GB/s, 10 us) while 4/8 cross the network (10 GB/s, 20 us); the network is slower.
    strategy = LayerStrategy(tp=2, dp=8, sp=True, ep=8)
    received = K * S * B / 2 * H * 2
    a2a = max(received * 3 / 8 / 50e9 + 1e-5, received * 4 / 8 / 10e9 + 2e-5)
    assert group_all_to_all_time(received, 8, 2, TOY) == approx(a2a)
    expected = 2 * a2a + all_gather_time(2 * received, 2, INTRA) + reduce_scatter_time(2 * received, 2, INTRA)
    assert dispatch_time(LAYER, S, B, strategy, TOY, BF16) == approx(expected)


def test_ep_all_to_all_inside_a_node_or_straddling_unevenly_is_plain():
    assert group_all_to_all_time(1e9, 4, 1, TOY) == approx(all_to_all_time(1e9, 4, INTRA))
    six_per_node = replace(TOY, gpus_per_node=6, num_nodes=2)  # a group of 4 straddles 6-GPU nodes in places
    assert group_all_to_all_time(1e9, 4, 1, six_per_node) == approx(all_to_all_time(1e9, 4, INTER))


def test_alltoall_bytes_scale_with_imbalance():
    skewed = replace(BF16, moe_load_imbalance=2.0)
    received = K * S * B * H * 2 * 2.0
    assert dispatch_time(LAYER, S, B, EP4, TOY, skewed) == approx(2 * all_to_all_time(received, 4, INTRA))


def test_allgather_dispatcher_gathers_all_tokens_of_the_tp_ep_group():
    allgather = replace(BF16, moe_token_dispatcher="allgather")
    gathered = 4 * S * B * H * 2  # ep 4 x etp 1 GPUs' tokens
    expected = all_gather_time(gathered, 4, INTRA) + reduce_scatter_time(gathered, 4, INTRA)
    assert dispatch_time(LAYER, S, B, EP4, TOY, allgather) == approx(expected)


def test_expert_view_shards_expert_states_by_ep_times_etp_and_expert_dp():
    view = expert_view(LayerStrategy(tp=2, dp=8, sp=True, ep=4, etp=1, zero=1))
    assert (view.tp, view.dp, view.zero) == (4, 4, 1)  # expert DP = 16 / (4 x 1)
    params = LAYER.expert_parameters
    # 18 bytes/param unsharded; distributed optimizer: 6 + 12 / expert_dp (Megatron docs/distrib_optimizer).
    assert model_state_bytes(params, view, BF16) == approx(params / 4 * (6 + 12 / 4))


def test_expert_gradients_sync_over_the_expert_dp_group():
    strategy = LayerStrategy(tp=1, dp=16, ep=4, zero=1)
    cost = expert_cost(LAYER, strategy, B, S, TOY, BF16)
    # Expert DP 4 with stride 4: blocks of 16 ranks span both nodes: inter-node.
    assert cost.dp_comm_per_iteration_s == approx(dp_comm_time(LAYER.expert_parameters,
                                                               LayerStrategy(tp=4, dp=4, zero=1), TOY, BF16))
    assert cost.dp_comm_per_iteration_s > 0


def test_expert_activations_per_processed_and_routed_copy():
    # EP4, bf16, SwiGLU: processed 2048 copies x (h + 5f + 1) words (fc1 input, the MLP's 4f, the scaled
    # activation, the probability); each of the 1024 tokens: k int64 top-k indices, k probabilities, k int64
    # sorted indices, and E routing-map bools and probabilities.
    expected = 2 * 2048 * (H + 5 * F + 1) + 1024 * (K * (8 + 2 + 8) + E * (1 + 2))
    assert expert_activation_bytes(LAYER, S, B, EP4, BF16, False) == approx(expected)
    assert expert_activation_bytes(LAYER, S, B, EP4, BF16, True) == 0.0
    gelu = replace(LAYER, swiglu=False)
    assert expert_activation_bytes(gelu, S, B, EP4, BF16, False) == approx(expected - 2 * 2048 * 2 * F)


@pytest.mark.parametrize("modules", [("moe",), ("core_attn", "moe", "shared_experts")])
def test_selective_moe_replays_the_experts_as_full_recompute_does(modules):
    training = replace(BF16, recompute_modules=modules)
    selective = expert_cost(LAYER, replace(EP4, recompute="selective"), B, S, TOY, training)
    full = expert_cost(LAYER, replace(EP4, recompute="full"), B, S, TOY, training)
    assert selective == full
    assert selective.activation_bytes == 0.0 and selective.recompute_s > 0


def test_selective_without_moe_leaves_the_experts_alone():
    training = replace(BF16, recompute_modules=("core_attn", "shared_experts"))
    assert expert_cost(LAYER, replace(EP4, recompute="selective"), B, S, TOY, training) == \
        expert_cost(LAYER, EP4, B, S, TOY, training)


def test_full_recompute_replays_the_experts_and_the_dispatch():
    full = replace(EP4, recompute="full")
    cost = expert_cost(LAYER, full, B, S, TOY, BF16)
    plain = expert_cost(LAYER, EP4, B, S, TOY, BF16)
    assert cost.recompute_s == approx(plain.forward_s)
    assert cost.comm_s == approx(1.5 * plain.comm_s)
    assert cost.rematerialised_bytes == approx(plain.activation_bytes)


def test_moe_layer_cost_is_its_dense_part_plus_its_experts():
    dense = dense_part_cost(LAYER, TP2_EP2, B, S, TOY, BF16)
    experts = expert_cost(LAYER, TP2_EP2, B, S, TOY, BF16)
    cost = layer_cost(LAYER, TP2_EP2, B, S, TOY, BF16)
    assert cost.forward_s == approx(dense.forward_s + experts.forward_s)
    assert cost.ep_comm_s == approx(experts.comm_s)
    assert cost.state_bytes == approx(dense.state_bytes + experts.state_bytes)
    assert cost.activation_bytes == approx(dense.activation_bytes + experts.activation_bytes)
    assert cost.micro_batch_s == approx(cost.forward_s + cost.backward_s + cost.tp_comm_s + cost.ep_comm_s)
    # The dense part holds the attention, norms and router: all but the routed experts.
    assert dense.state_bytes == approx(model_state_bytes(LAYER.dense_parameters, TP2_EP2, BF16))


def test_moe_layer_without_shared_expert_runs_half_the_tp_collectives():
    full_tp = tp_comm_time(H, S, B, TP2_EP2, TOY, 2)
    assert dense_part_cost(LAYER, TP2_EP2, B, S, TOY, BF16).tp_comm_s == approx(full_tp / 2)
    assert dense_part_cost(SHARED, TP2_EP2, B, S, TOY, BF16).tp_comm_s == approx(full_tp)


def test_dense_part_keeps_the_shared_experts_activations_only():
    no_mlp = layer_activation_bytes(LAYER, S, B, TP2_EP2, 2, 1, "flash")
    with_shared = layer_activation_bytes(SHARED, S, B, TP2_EP2, 2, 1, "flash")
    # SwiGLU without the bias-activation fusion keeps 4f (cost.memory.mlp_saved_width), over tp 2.
    assert with_shared - no_mlp == approx(2 * S * B * 4 * 1024 / 2)


def moe_model_plan(ep: int):
    model = uniform_model("toy-moe", 2, H, 16, S, 1000, ffn_hidden_size=4096, swiglu=True, normalization="RMSNorm",
                          add_bias_linear=False, position_embedding_type="rope", num_experts=E,
                          moe_ffn_hidden_size=F, moe_layer_freq=[0, 1])
    dense = LayerStrategy(tp=1, dp=8)
    plan = Plan(space="megatron", world_size=8, pipeline_parallel=1, global_batch_size=8, num_micro_batches=1,
                chunks=(Chunk((dense, LayerStrategy(tp=1, dp=8, ep=ep))),), embedding=dense)
    return model, plan


def test_estimate_reports_expert_parallel_traffic_and_flops():
    model, plan = moe_model_plan(ep=4)
    prediction = estimate_plan(plan, model, TOY.with_nodes(1), BF16)
    assert prediction.breakdown.ep_comm_s > 0
    _, dense_plan = moe_model_plan(ep=1)
    assert estimate_plan(dense_plan, model, TOY.with_nodes(1), BF16).breakdown.ep_comm_s == 0.0


def test_estimate_rejects_ep_that_does_not_divide_the_experts():
    model, plan = moe_model_plan(ep=8)
    model = uniform_model("toy-moe", 2, H, 16, S, 1000, swiglu=True, add_bias_linear=False, num_experts=4,
                          moe_layer_freq=[0, 1])
    with pytest.raises(UserError, match="experts"):
        estimate_plan(plan, model, TOY.with_nodes(1), BF16)


def test_dominated_strategies_leave_the_dp_tables():
    import numpy as np

    from megatron_auto.search.tables import LayerTables, drop_dominated

    a, b, c, d = (LayerStrategy(tp=1, dp=4), LayerStrategy(tp=1, dp=4, ep=2), LayerStrategy(tp=1, dp=4, ep=4),
                  LayerStrategy(tp=2, dp=2, sp=True))
    inf = np.inf
    # Layer 0 dense (expert variants cannot run it), layer 1 MoE. b beats a on the MoE layer; c is worse than b
    # in memory but faster; d has another layout, so it stays whatever its numbers.
    time = np.array([[1.0, inf, inf, 5.0], [3.0, 2.0, 1.5, 9.0]])
    state = np.array([[1.0, 0.0, 0.0, 1.0], [4.0, 2.0, 3.0, 9.0]])
    zeros = np.zeros_like(time)
    groups = np.array([0, 0, 0, 1])
    tables = LayerTables((a, b, c, d), time, zeros, state, zeros, zeros, np.zeros((4, 4)), groups)
    kept = drop_dominated(tables)
    assert kept.strategies == (a, b, c, d)  # a is the only one that runs the dense layer: nothing dominates it
    dense_time = time.copy()
    dense_time[0] = [1.0, 1.0, inf, 5.0]  # now b runs the dense layer as well as a does, and the MoE one better
    kept = drop_dominated(LayerTables((a, b, c, d), dense_time, zeros, state, zeros, zeros, np.zeros((4, 4)), groups))
    assert kept.strategies == (b, c, d)
    assert list(kept.groups) == [0, 0, 1] and kept.time.shape == (2, 3)
