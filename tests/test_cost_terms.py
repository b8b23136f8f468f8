"""Each cost term against a value computed by hand (the arithmetic is in the comments).

Sources as in the code: Narayanan et al. SC21 (arXiv 2104.04473) for FLOPs, TP
traffic and the pipeline; Korthikanti et al. 2022 (arXiv 2205.05198) for
activation memory; Megatron-LM docs/distrib_optimizer.md and Rajbhandari et al.
2020 (ZeRO) for model states; shared/reference/hardware.md for ring collectives.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.collectives import all_gather_time, all_reduce_time, p2p_time, reduce_scatter_time
from megatron_auto.cost.communication import (dp_comm_time, pipeline_p2p_time, tp_comm_time,
                                              transition_time, zero3_comm_time)
from megatron_auto.cost.compute import (ComputeTimes, elementwise_elements, gemm_efficiency, gemm_time,
                                        layer_compute_times, recompute_time)
from megatron_auto.cost.embedding import embedding_cost
from megatron_auto.cost.flops import Gemm, layer_forward_flops, layer_gemms, model_flops_per_iteration
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.memory import (embedding_activation_bytes, in_flight_micro_batches,
                                       layer_activation_bytes, logits_activation_bytes, model_state_bytes,
                                       zero3_gathered_bytes)
from megatron_auto.cost.pipeline import bubble_time, exposed_dp_time, pipeline_time
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs import ClusterSpec, ComputeEfficiency, GpuSpec, LinkSpec
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import GIB, TrainingSpec

# A toy cluster with round numbers: intra-node 100 GB/s x 0.5 = 50 GB/s effective,
# 10 us per step; inter-node 10 GB/s effective, 20 us per step; 100 TFLOP/s; 1 TB/s HBM.
INTRA = LinkSpec(100e9, 1e-5, efficiency=0.5)
INTER = LinkSpec(10e9, 2e-5, efficiency=1.0)
TOY = ClusterSpec(name="toy", num_nodes=2, gpus_per_node=8, gpu=GpuSpec("toy", 80 * GIB, 100e12, 1e12),
                  intra_node=INTRA, inter_node=INTER, compute=ComputeEfficiency(0.8, 256.0))
TOY_ONE_NODE = TOY.with_nodes(1)
BF16 = TrainingSpec(global_batch_size=8)
UNFUSED_FOREACH = TrainingSpec(global_batch_size=8, attention_backend="unfused", optimizer_impl="foreach")
# 16-bit weights and 16-bit gradient reduction: 2-byte traffic whichever byte count the DP terms use.
GRAD16 = TrainingSpec(global_batch_size=8, precision="fp16", grad_bytes=2)
# A GPT layer: h=1024, a=16, f=4h; s=512 tokens, b=2 samples per micro-batch.
H, A, S, B = 1024, 16, 512, 2
GPT = uniform_model("toy-gpt", 4, H, A, seq_length=S, vocab_size=51200)
LAYER = GPT.layers[0]
SBH = S * B * H  # 1,048,576


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


# --- collectives (hardware.md: ring all-reduce 2(n-1)/n, all-gather (n-1)/n) ---------

def test_ring_all_reduce_time():
    # 2*3/4 * 1e9 B / 50e9 B/s = 0.03 s, plus 2*(4-1) = 6 steps x 10 us.
    assert all_reduce_time(1e9, 4, INTRA) == approx(0.03 + 6e-5)
    assert all_reduce_time(1e9, 1, INTRA) == 0.0
    assert all_reduce_time(0.0, 4, INTRA) == 0.0


def test_ring_all_gather_and_reduce_scatter_time():
    # 3/4 * 1e9 / 50e9 = 0.015 s, plus 3 steps x 10 us.
    assert all_gather_time(1e9, 4, INTRA) == approx(0.015 + 3e-5)
    assert reduce_scatter_time(1e9, 4, INTRA) == approx(0.015 + 3e-5)
    # Inter-node, 8 ranks: 7/8 * 1e9 / 10e9 = 0.0875 s + 7 x 20 us.
    assert all_gather_time(1e9, 8, INTER) == approx(0.0875 + 1.4e-4)


def test_p2p_time():
    # 1e9 / 10e9 = 0.1 s + 20 us.
    assert p2p_time(1e9, INTER) == approx(0.1 + 2e-5)
    assert p2p_time(0, INTER) == 0.0


# --- FLOPs (SC21 Sec. 5.1) ------------------------------------------------------

def test_gpt_layer_forward_flops_is_24bsh2_plus_4bs2h():
    # 24*2*512*1024^2 = 25,769,803,776; 4*2*512^2*1024 = 2,147,483,648.
    assert layer_forward_flops(LAYER, S, B) == 24 * B * S * H**2 + 4 * B * S**2 * H == 27_917_287_424


def test_swiglu_gqa_layer_forward_flops():
    # tiny-llama h=64 a=4 g=2 (d=16) f=176, s=32, b=1:
    # QKV 2*32*64*128 = 524,288; QK^T and AV 2*4*32*16*32 = 131,072 each;
    # proj 2*32*64*64 = 262,144; fc1+gate 2*32*64*352 = 1,441,792; fc2 2*32*176*64 = 720,896.
    layer = MODEL_PRESETS["tiny-llama"].layers[0]
    assert layer_forward_flops(layer, 32, 1) == 524_288 + 2 * 131_072 + 262_144 + 1_441_792 + 720_896


def test_tp_shards_split_the_flops_evenly():
    total = sum(g.flops for g in layer_gemms(LAYER, S, B, tp=1))
    assert sum(g.flops for g in layer_gemms(LAYER, S, B, tp=4)) == approx(total / 4)


def test_model_flops_per_iteration_matches_sc21_closed_form():
    # 72 B s l h^2 (1 + s/6h + V/12lh): SC21 eq. (3) with 72 for 96 (no recompute pass).
    model, batch = MODEL_PRESETS["gpt3-175b"], 1536
    s, l, h, v = 2048, 96, 12288, 51200
    closed_form = 72 * batch * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_iteration(model, batch) == pytest.approx(closed_form, rel=1e-12)


# --- compute ----------------------------------------------------------------------

def test_gemm_efficiency_law():
    # 0.8 x 1024/(1024+256) x 512/(512+256) x 256/(256+256) = 0.8 x 0.8 x 2/3 x 0.5 = 0.21333...
    gemm = Gemm(1024, 512, 256)
    assert gemm_efficiency(gemm, ComputeEfficiency(0.8, 256.0)) == approx(0.8 * 0.8 * (2 / 3) * 0.5)
    # time = 2*1024*512*256 FLOPs / (100e12 x 0.21333) = 268,435,456 / 2.1333e13 = 1.2582912e-5 s
    assert gemm_time(gemm, TOY) == approx(268_435_456 / (100e12 * 0.8 * 0.8 * (2 / 3) * 0.5))


def test_gemm_efficiency_saturates_and_drops_with_sharding():
    model = ComputeEfficiency(0.7, 96.0)
    huge = gemm_efficiency(Gemm(10**7, 10**7, 10**7), model)
    assert 0.6999 < huge < 0.7
    assert gemm_efficiency(Gemm(4096, 4096, 4096 // 8), model) < gemm_efficiency(Gemm(4096, 4096, 4096), model)


def test_elementwise_elements():
    # Per token without SP: 11h = 11,264; GeLU 2f/t = 2*4096/4 = 2,048; softmax 2.5 a s/t = 5,120.
    # x 1024 tokens = 18,874,368 elements. With SP the 11h term is split by t: 2,816.
    assert elementwise_elements(LAYER, S, B, 4, False) == approx(1024 * (11_264 + 2_048 + 5_120))
    assert elementwise_elements(LAYER, S, B, 4, True) == approx(1024 * (2_816 + 2_048 + 5_120))


def test_layer_compute_times_and_recompute():
    times = layer_compute_times(LAYER, S, B, 4, False, TOY, 2)
    gemms = sum(gemm_time(g, TOY) for g in layer_gemms(LAYER, S, B, 4))
    # elementwise: 18,874,368 elements x 2 B / (1e12 B/s x 0.7)
    elementwise = 18_874_368 * 2 / 0.7e12
    assert times.forward_s == approx(gemms + elementwise)
    assert times.backward_s == approx(2 * times.forward_s)          # dgrad + wgrad
    core = sum(gemm_time(g, TOY) for g in layer_gemms(LAYER, S, B, 4)[1:3]) + 1024 * 5_120 * 2 / 0.7e12
    assert times.attention_core_forward_s == approx(core)
    assert recompute_time(times, "full") == times.forward_s
    assert recompute_time(times, "selective") == times.attention_core_forward_s
    assert recompute_time(times, "none") == 0.0
    assert recompute_time(ComputeTimes(1.0, 2.0, 0.25), "selective") == 0.25


# --- tensor-parallel communication (SC21 Sec. 3.3; Korthikanti Sec. 4.2.2) ---------

# One all-reduce of the bsh activation in 16-bit: 512*2*1024*2 B = 2,097,152 B over t=4:
# 2*3/4 * 2,097,152 / 50e9 = 6.291456e-5 s, + 6 steps x 10 us = 1.2291456e-4 s.
TP_AR = 1.5 * 2_097_152 / 50e9 + 6e-5


def test_tp_comm_four_all_reduces_per_layer():
    strategy = LayerStrategy(tp=4, dp=1)
    assert tp_comm_time(H, S, B, strategy, TOY, 2) == approx(4 * TP_AR)
    assert tp_comm_time(H, S, B, replace(strategy, recompute="selective"), TOY, 2) == approx(4 * TP_AR)
    assert tp_comm_time(H, S, B, LayerStrategy(tp=1, dp=4), TOY, 2) == 0.0


def test_tp_comm_with_sequence_parallel_has_the_same_volume():
    # AG + RS: 2 x (3/4 * 2,097,152 / 50e9 + 3 x 10 us) = one all-reduce.
    assert tp_comm_time(H, S, B, LayerStrategy(tp=4, dp=1, sp=True), TOY, 2) == approx(4 * TP_AR)


def test_sequence_parallel_regathers_are_exposed_where_nothing_overlaps():
    """Megatron-Core re-all-gathers the two column-parallel inputs in backward (async): hidden with
    grad_overlap 1 (TOY), exposed in full with grad_overlap 0 (cpu-gloo's runtime)."""
    gather = TP_AR / 2  # one all-gather: half an all-reduce's ring volume and steps
    no_overlap = replace(TOY, grad_overlap=0.0)
    assert tp_comm_time(H, S, B, LayerStrategy(tp=4, dp=1, sp=True), no_overlap, 2) == approx(4 * TP_AR + 2 * gather)
    assert tp_comm_time(H, S, B, LayerStrategy(tp=4, dp=1), no_overlap, 2) == approx(4 * TP_AR)


def test_tp_comm_full_recompute_replays_the_forward_two():
    assert tp_comm_time(H, S, B, LayerStrategy(tp=4, dp=1, recompute="full"), TOY, 2) == approx(6 * TP_AR)
    assert tp_comm_time(H, S, B, LayerStrategy(tp=4, dp=1, sp=True, recompute="full"), TOY, 2) == approx(6 * TP_AR)


def test_tp_across_nodes_uses_the_inter_node_link():
    # t=16 over 2 nodes: the ring crosses the network, with 8 ranks (8 NICs) of the group in each node:
    # min(8 x 10e9, NVLink's 50e9) = 50e9 B/s; the inter-node latency: 2*15/16 * 2,097,152 / 50e9 + 30 x 20 us.
    one = 2 * 15 / 16 * 2_097_152 / 50e9 + 30 * 2e-5
    assert tp_comm_time(H, S, B, LayerStrategy(tp=16, dp=1), TOY, 2) == approx(4 * one)


def test_ring_across_nodes_runs_at_the_nics_of_the_groups_ranks_in_a_node():
    # One rank of the group per node (stride 8): one NIC, 10e9. Two per node (stride 4): 20e9. Eight: capped
    # by NVLink's 50e9. Inside a node: NVLink.
    assert TOY.ring_link_for_group(2, 8).effective_bandwidth == approx(10e9)
    assert TOY.ring_link_for_group(4, 4).effective_bandwidth == approx(20e9)
    assert TOY.ring_link_for_group(16, 1).effective_bandwidth == approx(50e9)
    assert TOY.ring_link_for_group(8, 1) is TOY.intra_node
    assert TOY.ring_link_for_group(4, 4).latency_s == INTER.latency_s


# --- data-parallel and ZeRO communication ------------------------------------------

def test_dp_comm_zero0_all_reduce_vs_zero1_reduce_scatter_plus_all_gather():
    # 1e9 params / t=2 x 2 B = 1e9 B; dp=4 ranks 2 apart span 7 GPUs: intra-node.
    # ZeRO-0: all-reduce = 0.03 + 6e-5; ZeRO-1: RS + AG = 2 x (0.015 + 3e-5): the same.
    zero0 = dp_comm_time(1e9, LayerStrategy(tp=2, dp=4), TOY, GRAD16)
    zero1 = dp_comm_time(1e9, LayerStrategy(tp=2, dp=4, zero=1), TOY, GRAD16)
    assert zero0 == approx(0.03 + 6e-5)
    assert zero1 == approx(2 * (0.015 + 3e-5))
    assert dp_comm_time(1e9, LayerStrategy(tp=2, dp=4, zero=2), TOY, GRAD16) == approx(zero1)
    assert dp_comm_time(1e9, LayerStrategy(tp=8, dp=1), TOY, GRAD16) == 0.0
    assert dp_comm_time(1e9, LayerStrategy(tp=2, dp=4, zero=3), TOY, GRAD16) == 0.0


def test_dp_comm_spanning_nodes_is_inter_node():
    # dp=8 ranks 2 apart span 15 GPUs: inter-node, 4 of the group's ranks (4 NICs) in each node:
    # 2*7/8 * 1e9 / (4 x 10e9) = 0.04375 s + 14 x 20 us.
    assert dp_comm_time(1e9, LayerStrategy(tp=2, dp=8), TOY, GRAD16) == approx(0.04375 + 2.8e-4)


def test_zero3_per_micro_batch_traffic():
    # Two all-gathers (forward, backward) + one reduce-scatter of 1e9 B over 4 ranks:
    # 3 x (0.015 + 3e-5) = 0.04509 s = 1.5x the all-reduce volume (ZeRO paper Sec. 7.2.2).
    z3 = LayerStrategy(tp=2, dp=4, zero=3)
    assert zero3_comm_time(1e9, z3, TOY, GRAD16, recompute_full=False) == approx(3 * (0.015 + 3e-5))
    # Full recompute gathers once more: 4 x 0.01503.
    assert zero3_comm_time(1e9, z3, TOY, GRAD16, recompute_full=True) == approx(4 * (0.015 + 3e-5))
    assert zero3_comm_time(1e9, LayerStrategy(tp=2, dp=4, zero=1), TOY, GRAD16, False) == 0.0


def test_dp_gradient_traffic_uses_gradient_bytes():
    # Megatron-LM reduces bf16 gradients in fp32 (megatron/training/arguments.py: "bfloat16
    # requires gradient accumulation and all-reduce to be done in fp32"), and this project's
    # runtime sets grad_reduce_in_fp32=True (runtime/config.py): dp_comm_time moves
    # TrainingSpec.grad_bytes (4) per gradient, not param_bytes (2).
    # ZeRO-0: all-reduce of 1e9/2 x 4 B = 2e9 B: 2*3/4 * 2e9 / 50e9 + 6 x 10 us = 0.06006 s.
    assert dp_comm_time(1e9, LayerStrategy(tp=2, dp=4), TOY, BF16) == approx(0.06 + 6e-5)
    # ZeRO-1: reduce-scatter of fp32 gradients (3/4 * 2e9 / 50e9 = 0.03 s + 30 us) plus
    # all-gather of the updated bf16 weights (3/4 * 1e9 / 50e9 = 0.015 s + 30 us).
    assert dp_comm_time(1e9, LayerStrategy(tp=2, dp=4, zero=1), TOY, BF16) == approx(0.045 + 6e-5)


# --- pipeline and layout transitions ---------------------------------------------

def test_pipeline_p2p_scatter_gather():
    # Micro-batch of 8 samples, sbh x 2 B = 512*8*1024*2 = 8,388,608 B, split over 4 GPUs
    # per stage = 2,097,152 B each; forward + backward: 2 x (2,097,152/50e9 + 10 us).
    assert pipeline_p2p_time(H, S, 8, 4, 2, TOY_ONE_NODE, 2) == approx(2 * (2_097_152 / 50e9 + 1e-5))
    # 2 nodes, pp=2: stages are 8 ranks apart, across the node boundary.
    assert pipeline_p2p_time(H, S, 8, 8, 2, TOY, 2) == approx(2 * (1_048_576 / 10e9 + 2e-5))
    assert pipeline_p2p_time(H, S, 8, 4, 1, TOY_ONE_NODE, 2) == 0.0


def test_pipeline_p2p_over_a_node_boundary_is_inter_node():
    # 2 nodes, pp=4, 4 GPUs per stage. Stage 1 (ranks 4-7) sends to stage 2 (ranks 8-11):
    # that boundary crosses InfiniBand, and the slowest boundary sets the pipeline's pace,
    # although the stage stride (4) is below the node size (8).
    # 2 x (2,097,152 / 10e9 + 20 us) = 4.594304e-4 s.
    assert pipeline_p2p_time(H, S, 8, 4, 4, TOY, 2) == approx(2 * (2_097_152 / 10e9 + 2e-5))


def test_transition_time():
    same = LayerStrategy(tp=2, dp=2)
    assert transition_time(same, replace(same, zero=3, recompute="full"), H, S, 8, TOY, 2) == 0.0
    # dp 2 -> 4: all-gather over 2 ranks of the dp=2 layout's 4 samples:
    # 512*4*1024*2 = 4,194,304 B; 1/2 x 4,194,304 / 50e9 + 10 us = 5.194304e-5 s.
    expected = 0.5 * 4_194_304 / 50e9 + 1e-5
    assert transition_time(same, LayerStrategy(tp=1, dp=4), H, S, 8, TOY, 2) == approx(expected)
    assert transition_time(LayerStrategy(tp=1, dp=4), same, H, S, 8, TOY, 2) == approx(expected)
    # SP on -> off at t=2: all-gather the sequence of 4 samples over the TP group.
    assert transition_time(replace(same, sp=True), same, H, S, 8, TOY, 2) == approx(expected)


def test_in_flight_micro_batches():
    # 1F1B: stage s of p holds p - s (capped at m); GPipe holds all m.
    assert [in_flight_micro_batches(s, 4, 8, 1, "1f1b") for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight_micro_batches(s, 4, 2, 1, "1f1b") for s in range(4)] == [2, 2, 2, 1]
    assert in_flight_micro_batches(2, 4, 8, 1, "gpipe") == 8
    # Interleaved, stage 0: (2(p-1) + (v-1)p + 1) / v chunk-micro-batches = p (1 + (p-1)/(pv)).
    # p=4, v=2: (6 + 4 + 1)/2 = 5.5 = 4 x (1 + 3/8).
    assert in_flight_micro_batches(0, 4, 8, 2, "1f1b") == approx(4 * (1 + 3 / 8))
    assert in_flight_micro_batches(0, 8, 64, 4, "1f1b") == approx(8 * (1 + 7 / 32))
    # Last stage: ((v-1)p + 1)/v = 5/2; few micro-batches cap it at m: min(11, 2*2)/2 = 2.
    assert in_flight_micro_batches(3, 4, 8, 2, "1f1b") == approx(2.5)
    assert in_flight_micro_batches(0, 4, 2, 2, "1f1b") == approx(2.0)


def test_pipeline_time_balanced_stages():
    # 1F1B / GPipe: (m + p - 1) T; interleaved: (m + (p-1)/v) T.
    assert pipeline_time([2.0] * 4, 8) == approx((8 + 3) * 2.0)
    assert pipeline_time([2.0] * 4, 8, virtual_stages=3) == approx((8 + 3 / 3) * 2.0)
    assert bubble_time([2.0] * 4, 8) == approx(3 * 2.0)                # (p-1)/m of m T
    assert bubble_time([2.0] * 4, 8, 2) == approx(3 * 2.0 / 2)


def test_pipeline_time_unbalanced_stages():
    # m T_max + (sum T - T_max) / v: 4 x 3 + (1 + 2) = 15.
    assert pipeline_time([1.0, 3.0, 2.0], 4) == approx(15.0)
    assert pipeline_time([1.0, 3.0, 2.0], 4, 3) == approx(13.0)


def test_exposed_dp_time():
    # One layer's gradient bucket hides behind that layer's backward (Megatron-Core DDP overlap).
    assert exposed_dp_time(5.0, 3.0) == 2.0
    assert exposed_dp_time(5.0, 10.0) == 0.0


def test_the_weight_all_gather_hides_behind_the_forward_and_the_reduce_scatter_behind_the_backward():
    """--overlap-param-gather: Megatron-Core's DDP gathers each bucket's updated weights beside the next
    iteration's forward (a module's forward pre-hook waits for its bucket and dispatches the next); the gradients'
    reduce-scatter runs beside the backward (communication.dp_comm_times)."""
    from megatron_auto.cost.communication import dp_comm_times
    from megatron_auto.cost.estimate import StageCost
    from megatron_auto.cost.layer_cost import layer_cost
    from megatron_auto.cost.models import comm_model
    from megatron_auto.cost.pipeline import exposed_dp_split

    assert exposed_dp_split(5.0, 2.0, 3.0, 1.0) == exposed_dp_time(3.0, 3.0) + exposed_dp_time(2.0, 1.0) == 1.0
    assert exposed_dp_split(5.0, 0.0, 3.0, 10.0) == exposed_dp_time(5.0, 3.0)  # no gather: as before
    zero1 = LayerStrategy(tp=1, dp=16, zero=1)  # across the two nodes: more traffic than one backward hides
    gather = dp_comm_times(LAYER.num_parameters, zero1, TOY, BF16)[1]
    assert gather == approx(dp_comm_time(LAYER.num_parameters, zero1, TOY, BF16)
                            - comm_model(TOY).collective_time("reduce_scatter", LAYER.num_parameters * 4, 16, 1, TOY))
    assert dp_comm_times(LAYER.num_parameters, LayerStrategy(tp=1, dp=16), TOY, BF16)[1] == 0.0  # all-reduce
    cost = layer_cost(LAYER, zero1, B, S, TOY, BF16)
    assert gather > 0 and cost.dp_gather_per_iteration_s == approx(gather)
    stage = StageCost(grad_overlap=1.0)
    stage.add_layer(cost, 3)  # the first unit has no window; the others hide each part beside its own pass
    hidden = exposed_dp_split(cost.dp_comm_per_iteration_s, gather, cost.backward_s, cost.forward_s)
    assert stage.exposed_dp_s == approx(cost.dp_comm_per_iteration_s + 2 * hidden)
    assert hidden < exposed_dp_time(cost.dp_comm_per_iteration_s, cost.backward_s)  # both in the backward: more


# --- memory (Korthikanti et al. 2022, Table 2; Megatron distrib_optimizer doc) -----

def act(t, sp=False, recompute="none"):
    return layer_activation_bytes(LAYER, S, B, LayerStrategy(tp=t, dp=1, sp=sp, recompute=recompute), 2)


# Korthikanti et al. count the softmax output in 16 bits (5as^2b); Megatron-Core's unfused path keeps it
# in fp32 (attention_softmax_in_fp32): 7as^2b, measured on an H100 (data/reference/h100). The two norms
# keep fp32 mean and rstd: 16 sb bytes, sequence-split with SP.
NORM_STATS = 16 * S * B


def test_activation_memory_with_sp_is_sbh_34_over_t_plus_7as_over_ht():
    # sbh (34/4 + 7*16*512/(1024*4)) + 16 sb / 4 = 1,048,576 x (8.5 + 14) + 4,096 = 23,597,056 B
    assert act(4, sp=True) == approx(SBH * (34 / 4 + 7 * A * S / (H * 4)) + NORM_STATS / 4) == approx(23_597_056)


def test_activation_memory_without_sp_is_sbh_10_plus_24_over_t_plus_7as_over_ht():
    # sbh (10 + 24/4 + 14) + 16 sb = 1,048,576 x 30 + 16,384 = 31,473,664 B
    assert act(4) == approx(SBH * (10 + 24 / 4 + 7 * A * S / (H * 4)) + NORM_STATS) == approx(31_473_664)
    # t = 1: sbh (34 + 7as/h) + 16 sb
    assert act(1) == approx(SBH * (34 + 7 * A * S / H) + NORM_STATS)


def test_flash_attention_keeps_no_scores_only_the_log_sum_exp():
    # Korthikanti without 5as/h, plus the fp32 log-sum-exp: 4 a s b / t = 4*16*512*2/4 = 16,384 B
    flash = layer_activation_bytes(LAYER, S, B, LayerStrategy(tp=4, dp=1, sp=True), 2, attention_backend="flash")
    assert flash == approx(SBH * 34 / 4 + NORM_STATS / 4 + 16_384)
    # unfused minus flash: the s x s scores, (4 + 2 + 1) a s^2 b / t = 7*16*512*512*2/4 = 14,680,064 B
    assert act(4, sp=True) - flash == approx(14_680_064 - 16_384)


def test_activation_memory_selective_recompute():
    # SP: 34 sbh / t + 16 sb / t = 8,916,992 B; no SP: sbh (10 + 24/t) + 16 sb
    assert act(4, sp=True, recompute="selective") == approx(34 * SBH / 4 + NORM_STATS / 4) == approx(8_916_992)
    assert act(4, recompute="selective") == approx(SBH * (10 + 24 / 4) + NORM_STATS)


def test_activation_memory_full_recompute_keeps_the_input():
    # 2 sbh = 2,097,152 B without SP; with SP the input is sequence-sharded: 2 sbh / t.
    assert act(4, recompute="full") == approx(2 * SBH) == approx(2_097_152)
    assert act(4, sp=True, recompute="full") == approx(2 * SBH / 4)


def test_embedding_and_logits_activation_bytes():
    # Embedding output + dropout mask: sbh (2 + 1) = 3,145,728 B (/t with SP).
    assert embedding_activation_bytes(GPT, B, LayerStrategy(tp=4, dp=1), 2) == approx(3 * SBH)
    assert embedding_activation_bytes(GPT, B, LayerStrategy(tp=4, dp=1, sp=True), 2) == approx(3 * SBH / 4)
    # fp32 logits: 4 s b V / t = 4*512*2*51200/4 = 52,428,800 B
    assert logits_activation_bytes(GPT, B, LayerStrategy(tp=4, dp=1)) == approx(52_428_800)


def test_model_state_bytes_18_per_param_and_distributed_optimizer():
    n = 1e9
    assert model_state_bytes(n, LayerStrategy(tp=1, dp=8), BF16) == approx(18e9)       # 2 + 4 + 12
    assert model_state_bytes(n, LayerStrategy(tp=2, dp=4), BF16) == approx(9e9)        # 18 / t
    assert model_state_bytes(n, LayerStrategy(tp=1, dp=8, zero=1), BF16) == approx((6 + 12 / 8) * 1e9)
    assert model_state_bytes(n, LayerStrategy(tp=1, dp=8, zero=2), BF16) == approx((2 + 16 / 8) * 1e9)
    assert model_state_bytes(n, LayerStrategy(tp=1, dp=8, zero=3), BF16) == approx(18 / 8 * 1e9)
    assert model_state_bytes(n, LayerStrategy(tp=1, dp=8), TrainingSpec.fp32(8)) == approx(16e9)  # 4+4+8


def test_zero3_gathered_bytes():
    # weights + their gradients unsharded while the layer runs: 2 x 1e9/2 x 2 B
    assert zero3_gathered_bytes(1e9, LayerStrategy(tp=2, dp=4, zero=3), BF16) == approx(2e9)
    assert zero3_gathered_bytes(1e9, LayerStrategy(tp=2, dp=4, zero=1), BF16) == 0.0


# --- assembled per-layer and embedding costs -------------------------------------

def test_layer_cost_assembles_the_terms():
    strategy = LayerStrategy(tp=4, dp=1, sp=True, recompute="selective")
    cost = layer_cost(LAYER, strategy, B, S, TOY, BF16)
    times = layer_compute_times(LAYER, S, B, 4, True, TOY, 2)
    assert cost.recompute_s == approx(times.attention_core_forward_s)
    assert cost.micro_batch_s == approx(times.forward_s * 3 + times.attention_core_forward_s + 4 * TP_AR)
    assert cost.activation_bytes == approx(34 * SBH / 4 + NORM_STATS / 4)
    # flash (BF16's default): the recomputed core attention kept only its log-sum-exp, 4 a s b / t
    assert cost.transient_bytes == approx(4 * A * S * B / 4)
    assert cost.workspace_bytes == 0.0
    assert cost.optimizer_temporary_bytes == 0.0  # fused Adam (BF16's default)
    assert cost.state_bytes == approx(18 * LAYER.num_parameters / 4)


def test_unfused_attention_and_foreach_adam_add_their_bytes():
    strategy = LayerStrategy(tp=4, dp=1, sp=True, recompute="selective")
    cost = layer_cost(LAYER, strategy, B, S, TOY, UNFUSED_FOREACH)
    # transient: the recomputed attention core, 7as^2b/t = sbh x 7as/(ht) = 1,048,576 x 14, and the
    # softmax backward's two fp32 gradients, 8as^2b/t = 1,048,576 x 16
    assert cost.transient_bytes == approx(SBH * (14 + 16))
    # the unfused attention's scores buffer in bf16: 2 a s^2 b / t = 1,048,576 x 4
    assert cost.workspace_bytes == approx(SBH * 4)
    # foreach Adam: one fp32 temporary per master weight of the shard, 4 N / t
    assert cost.optimizer_temporary_bytes == approx(4 * LAYER.num_parameters / 4)


def test_zero3_traffic_hides_behind_compute():
    tiny = MODEL_PRESETS["tiny-gpt"].layers[0]
    z3 = LayerStrategy(tp=1, dp=8, zero=3)
    cost = layer_cost(tiny, z3, 1, 32, TOY_ONE_NODE, BF16)
    compute = cost.forward_s + cost.backward_s + cost.recompute_s
    expected = zero3_comm_time(tiny.num_parameters, z3, TOY_ONE_NODE, BF16, recompute_full=False)
    assert cost.zero3_exposed_s == approx(max(0.0, expected - compute))
    assert cost.zero3_exposed_s > 0  # a tiny layer cannot hide 21 latency steps


def test_head_weights_only_with_a_pipeline_or_untied():
    strategy = LayerStrategy(tp=4, dp=1)
    # Tied, p=1: the LM head reuses the embedding; p>1: the last stage keeps a copy (V h x 18 / t).
    assert embedding_cost(GPT, strategy, B, TOY, BF16, 1).head.state_bytes == 0.0
    assert embedding_cost(GPT, strategy, B, TOY, BF16, 2).head.state_bytes == approx(51200 * H * 18 / 4)
    embedding = embedding_cost(GPT, strategy, B, TOY, BF16, 2).embedding
    assert embedding.state_bytes == approx((51200 + 512) * H * 18 / 4)
    assert embedding.tp_comm_s == approx(TP_AR)  # one all-reduce of the embedding output


def test_cross_entropy_adds_three_token_all_reduces_under_tp():
    from megatron_auto.cost.embedding import cross_entropy_comm_time
    from megatron_auto.cost.models import comm_model
    from megatron_auto.specs.presets import CLUSTER_PRESETS

    cluster = CLUSTER_PRESETS["dgx-a100-80gb"]
    assert cross_entropy_comm_time(4096, LayerStrategy(tp=1, dp=8), cluster) == 0.0
    one = comm_model(cluster).collective_time("all_reduce", 4.0 * 4096, 8, 1, cluster)
    assert cross_entropy_comm_time(4096, LayerStrategy(tp=8, dp=1), cluster) == pytest.approx(3 * one)
