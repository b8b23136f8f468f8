"""Context parallelism in the Plan, the cost model (cost/context_parallel.py), `estimate --cp` and the search."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto import serde
from megatron_auto.cost.context_parallel import cp_qkv_kept_width, kv_exchange_time, ring_kv_exchange_time
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.memory import layer_activation_bytes, qkv_kept_width
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import Chunk, LayerStrategy, Plan
from megatron_auto.runtime.layout import layout_from_plan
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.loaders import load_cluster
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec
from test_cli import assert_user_error, ok_json, run_cli

LLAMA = MODEL_PRESETS["llama3-70b"]
H100 = load_cluster("dgx-h100-80gb", 2)
BF16 = TrainingSpec(global_batch_size=64)
LAYER = LLAMA.layers[0]


def test_a_context_parallel_strategy_spans_tp_cp_dp_and_reduces_gradients_over_dp_cp():
    strategy = LayerStrategy(tp=4, dp=2, cp=2, zero=1, sp=True)
    assert (strategy.gpus, strategy.gradient_dp) == (16, 4)
    assert strategy.short() == "tp4·cp2·dp2·z1·sp"
    assert serde.from_dict(LayerStrategy, serde.to_dict(strategy)) == strategy
    with pytest.raises(ValueError, match="at least 1"):
        LayerStrategy(cp=0)


def _plan(cp: int, model=LLAMA, space="megatron", seq=None, tp=4) -> Plan:
    """Two stages of tp x cp x dp 2 ranks each."""
    model = replace(model, seq_length=seq) if seq else model
    strategy = LayerStrategy(tp=tp, dp=2, cp=cp, zero=1, sp=tp > 1)
    half = model.num_layers // 2
    return Plan(space=space, world_size=2 * strategy.gpus, pipeline_parallel=2, global_batch_size=64,
                num_micro_batches=16, chunks=(Chunk((strategy,) * half), Chunk((strategy,) * half)),
                embedding=strategy, model=model)


def test_plans_refuse_context_parallelism_where_megatron_core_or_the_pricing_cannot_take_it():
    assert _plan(2).embedding.cp == 2
    with pytest.raises(ValueError, match="splits each sequence into 8 chunks"):
        _plan(4, seq=8196)
    with pytest.raises(ValueError, match="megatron-space"):
        _plan(2, space="hybrid")
    assert _plan(2, model=MODEL_PRESETS["tiny-mixtral"], tp=1).embedding.cp == 2  # MoE layers run under CP


MIXTRAL = MODEL_PRESETS["mixtral-8x7b"]
MOE_LAYER = MIXTRAL.layers[0]


@pytest.mark.parametrize("ep, etp", [(4, 1), (8, 1), (2, 2)])
def test_a_moe_layer_under_cp_is_its_dense_part_under_cp_plus_experts_on_the_local_tokens(ep, etp):
    """The router and experts see the rank's s / cp tokens, and CP folds into the experts' data parallelism
    (Megatron-Core's expert groups span tp x cp x dp): priced as the experts at the local sequence with
    dp x cp. The attention's CP terms are the dense part's."""
    from megatron_auto.cost.layer_cost import dense_part_cost
    from megatron_auto.cost.moe import expert_cost

    strategy = LayerStrategy(tp=2, dp=2, cp=2, zero=1, sp=True, ep=ep, etp=etp)
    folded = LayerStrategy(tp=2, dp=4, zero=1, sp=True, ep=ep, etp=etp)
    cost = layer_cost(MOE_LAYER, strategy, 1, 8192, H100, BF16)
    experts = expert_cost(MOE_LAYER, folded, 1, 4096, H100, BF16)
    dense_cp = layer_cost(replace(MOE_LAYER, moe=None), replace(strategy, ep=1, etp=None), 1, 8192, H100, BF16)
    assert cost.ep_comm_s == pytest.approx(experts.comm_s, rel=1e-12) and cost.ep_comm_s > 0
    assert cost.cp_comm_s > 0 and cost.state_bytes == pytest.approx(
        dense_part_cost(MOE_LAYER, folded, 1, 4096, H100, BF16).state_bytes + experts.state_bytes, rel=1e-12)
    assert cost.forward_s - experts.forward_s == pytest.approx(
        dense_cp.forward_s - dense_part_cost(replace(MOE_LAYER, moe=None), replace(folded, ep=1, etp=None), 1,
                                             4096, H100, BF16).forward_s
        + dense_part_cost(MOE_LAYER, folded, 1, 4096, H100, BF16).forward_s, rel=1e-9)


def test_the_weights_are_priced_as_data_parallel_over_dp_times_cp():
    # Replicated over CP: the distributed optimizer shards, and the gradients are reduced, over dp x cp ranks.
    split = layer_cost(LAYER, LayerStrategy(tp=4, dp=2, cp=2, zero=1, sp=True), 1, 8192, H100, BF16)
    flat = layer_cost(LAYER, LayerStrategy(tp=4, dp=4, zero=1, sp=True), 1, 8192, H100, BF16)
    assert split.state_bytes == flat.state_bytes
    assert split.dp_comm_per_iteration_s == flat.dp_comm_per_iteration_s


def test_a_cp_rank_keeps_its_tokens_activations_plus_the_whole_sequences_keys_and_values():
    strategy = LayerStrategy(tp=4, dp=2, cp=2, zero=1, sp=True)
    cost = layer_cost(LAYER, strategy, 1, 8192, H100, BF16)
    local = layer_activation_bytes(LAYER, 4096, 1, replace(strategy, cp=1), 2, H100.dropout_mask_bytes, "flash")
    # Llama 3: RoPE writes a new Q; K and V of all 8192 tokens kept, expanded to the 64 query heads.
    a, d = LAYER.num_attention_heads, LAYER.kv_channels
    assert cp_qkv_kept_width(LAYER, 2) == 2 * a * d * 2 + a * d
    whole_kv = 2 * 4096 / 4 * (cp_qkv_kept_width(LAYER, 2) - qkv_kept_width(LAYER, True))
    assert cost.activation_bytes == pytest.approx(local + whole_kv)
    no_cp = layer_cost(LAYER, LayerStrategy(tp=4, dp=4, zero=1, sp=True), 1, 8192, H100, BF16)
    assert 0.5 * no_cp.activation_bytes < cost.activation_bytes < 0.75 * no_cp.activation_bytes
    # Under full recompute only the layer input is kept; the gathered K and V live while the layer is rebuilt.
    full = layer_cost(LAYER, replace(strategy, recompute="full"), 1, 8192, H100, BF16)
    assert full.activation_bytes == pytest.approx(2 * 4096 * LAYER.hidden_size / 4)
    assert full.transient_bytes >= whole_kv


def test_k_and_v_travel_over_the_cp_group_and_again_when_the_core_is_recomputed():
    strategy = LayerStrategy(tp=4, dp=2, cp=2, zero=1, sp=True)
    once = kv_exchange_time(LAYER, 8192, 1, strategy, H100, 2, gathers=1)
    twice = kv_exchange_time(LAYER, 8192, 1, strategy, H100, 2, gathers=2)
    assert 0 < once < twice < 2 * once
    assert layer_cost(LAYER, strategy, 1, 8192, H100, BF16).cp_comm_s == once
    assert layer_cost(LAYER, replace(strategy, recompute="full"), 1, 8192, H100, BF16).cp_comm_s == twice
    assert layer_cost(LAYER, replace(strategy, cp=1, dp=4), 1, 8192, H100, BF16).cp_comm_s == 0.0


def test_a_cp_rank_does_its_share_of_the_attention_and_half_the_rest():
    # At 32768 tokens (Llama 3.1's long-context stage) the GEMMs see half the tokens, and the causal core over
    # a rank's two chunks is half the whole sequence's, twice that of 16384 tokens alone: about half the time.
    split = layer_cost(LAYER, LayerStrategy(tp=4, dp=2, cp=2, zero=1, sp=True), 1, 32768, H100, BF16)
    whole = layer_cost(LAYER, LayerStrategy(tp=4, dp=4, zero=1, sp=True), 1, 32768, H100, BF16)
    alone = layer_cost(LAYER, LayerStrategy(tp=4, dp=4, zero=1, sp=True), 1, 16384, H100, BF16)
    assert alone.forward_s < split.forward_s < 0.52 * whole.forward_s
    assert alone.backward_s < split.backward_s < 0.52 * whole.backward_s
    assert split.forward_s == pytest.approx(0.5 * whole.forward_s, rel=0.05)


def test_flags_name_context_parallelism_and_the_runtime_layout_carries_it():
    plan = build_uniform_plan(LLAMA, H100.with_nodes(4), BF16,
                              UniformConfig(tp=4, pp=2, micro_batch_size=1, sequence_parallel=True,
                                            distributed_optimizer=True, cp=2))
    assert plan.embedding.cp == 2 and plan.embedding.dp == 2
    flags = megatron_flags(plan)
    assert flags[flags.index("--context-parallel-size") + 1] == "2"
    assert "--context-parallel-size" not in megatron_flags(build_uniform_plan(
        LLAMA, H100.with_nodes(4), BF16, UniformConfig(tp=4, pp=2, micro_batch_size=1)))
    layout = layout_from_plan(plan)
    assert (layout.dims.cp, layout.dims.dp, layout.dims.world_size) == (2, 2, 32)
    assert estimate_plan(plan, LLAMA, H100.with_nodes(4), BF16).breakdown.cp_comm_s > 0


ESTIMATE = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "16",
            "--global-batch-size", "512", "--tp", "4", "--pp", "4", "--micro-batch-size", "1", "--virtual-stages",
            "5", "--sequence-parallel", "--distributed-optimizer"]


def test_estimate_prices_llama3_70b_with_context_parallelism_where_it_alone_fits():
    # NeMo's Llama 3 70B recipe runs TP4 PP4 VP5 with CP2 at 8192 tokens: without CP it does not fit in 80 GB.
    without = ok_json(*ESTIMATE)
    split = ok_json(*ESTIMATE, "--cp", "2")
    assert not without["fits"] and split["fits"]
    # Transformer Engine's ring hides the K/V exchange behind the core; the local spec's all-gather waits for it.
    local = ok_json(*ESTIMATE, "--cp", "2", "--transformer-impl", "local")
    assert local["breakdown"]["cp_comm_s"] > split["breakdown"]["cp_comm_s"] >= 0
    # The same work per rank, plus the K/V exchange and smaller kernels: a few percent more time.
    assert without["iteration_time_s"] < split["iteration_time_s"] < 1.1 * without["iteration_time_s"]
    flags = split["megatron_flags"]
    assert flags[flags.index("--context-parallel-size") + 1] == "2"


@pytest.mark.parametrize("extra, fragment", [
    (["--cp", "3"], "world size 128 is not divisible by TP 4 x CP 3 x PP 4 = 48"),
    (["--cp", "2", "--dp", "8"], "--dp 8 does not match"),
    (["--cp", "2", "--attention-backend", "unfused"], "flash"),
])
def test_estimate_cp_errors_are_one_line(extra, fragment):
    assert_user_error(run_cli(*ESTIMATE, *extra), fragment)


MIXTRAL_ESTIMATE = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8",
                    "--global-batch-size", "256", "--tp", "2", "--pp", "4", "--sequence-parallel",
                    "--distributed-optimizer", "--etp", "1", "--micro-batch-size", "1"]


def test_estimate_prices_a_moe_model_under_cp_with_experts_over_tp_cp_dp():
    # 64 GPUs, TP2 x PP4 x CP2 leaves dp 4; the 8 experts' groups span tp x cp x dp = 16 ranks of a stage.
    under_cp = ok_json(*MIXTRAL_ESTIMATE, "--cp", "2", "--ep", "8")
    without = ok_json(*MIXTRAL_ESTIMATE, "--ep", "8")
    assert under_cp["megatron_flags"][under_cp["megatron_flags"].index("--context-parallel-size") + 1] == "2"
    local = ok_json(*MIXTRAL_ESTIMATE, "--cp", "2", "--ep", "8", "--transformer-impl", "local")
    assert local["breakdown"]["cp_comm_s"] > 0 and "--context-parallel-size" not in without["megatron_flags"]
    # Each rank keeps half of each sequence's activations (and the experts' states are sharded the same).
    assert under_cp["memory_breakdown"]["activations_gib"] < 0.6 * without["memory_breakdown"]["activations_gib"]


PLAN = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "16",
        "--global-batch-size", "512"]


def test_the_search_picks_context_parallelism_for_llama3_70b_and_beats_every_plan_without_it():
    # CP splits the activations, which lets a faster layout fit (NeMo's recipe for this model runs CP 2; at
    # dropout 0 TP2 x CP4 and TP4 x CP2 price within 0.1% of each other).
    best = ok_json(*PLAN)
    without = ok_json(*PLAN, "--cp", "1")
    flags = best["megatron_flags"]
    assert best["fits"] and flags[flags.index("--context-parallel-size") + 1] in ("2", "4")
    assert "--context-parallel-size" not in without["megatron_flags"]
    assert best["iteration_time_s"] < without["iteration_time_s"]
    pinned = ok_json(*PLAN, "--cp", "2")
    assert pinned["megatron_flags"][pinned["megatron_flags"].index("--context-parallel-size") + 1] == "2"
    assert best["iteration_time_s"] <= pinned["iteration_time_s"] < without["iteration_time_s"]


def test_the_search_keeps_short_sequences_mla_and_the_unfused_core_at_cp_1_and_searches_moe_under_cp():
    from megatron_auto.search import search_plan
    from megatron_auto.search.constraints import SearchConstraints
    from megatron_auto.search.megatron_space import SpaceStats, context_parallel_choices

    cluster, constraints = load_cluster("dgx-h100-80gb", 16), SearchConstraints()
    stats = SpaceStats()
    # cp 4 puts 16 tp x cp ranks over two nodes, as NVIDIA's recipes do; cp 8 would keep 1024 tokens; cp 16 and 32
    # do not divide the 8 ranks tp 4 x pp 4 leaves of 128
    assert context_parallel_choices(LLAMA, cluster, BF16, constraints, 4, 4, stats) == [1, 2, 4]
    assert stats.pruning == {"cp-long-sequences": 1}
    gpt3 = MODEL_PRESETS["gpt3-175b"]  # 2048 tokens: a CP rank would keep fewer than MIN_CP_TOKENS
    assert context_parallel_choices(gpt3, cluster, BF16, constraints, 2, 1, stats) == [1]
    # 64 samples do not split over the 128 replicas of tp 1 x pp 1, with or without CP
    assert context_parallel_choices(gpt3, cluster, BF16, constraints, 1, 1, stats) == []
    assert context_parallel_choices(LLAMA, cluster, replace(BF16, attention_backend="unfused"), constraints,
                                    4, 4, stats) == [1]
    assert context_parallel_choices(MODEL_PRESETS["mixtral-8x7b"], cluster, BF16, constraints, 4, 4, stats) == [1, 2]
    assert context_parallel_choices(MODEL_PRESETS["deepseek-v2-lite"], cluster, BF16, constraints, 4, 4, stats) == [1]
    found = search_plan(gpt3, load_cluster("dgx-a100-80gb", 128), TrainingSpec(global_batch_size=1536),
                        "megatron").plan
    assert found.embedding.cp == 1


def test_te_ring_hides_the_k_and_v_transfers_behind_the_core_as_far_as_it_lasts():
    """Transformer Engine's ring (TrainingSpec.fused_norms): cp - 1 transfers beside cp - 1 of the cp steps'
    core work; forward K and V once, backward K and V with their gradients; all of it shows where the cluster
    overlaps nothing."""
    strategy = LayerStrategy(tp=8, dp=1, cp=8, zero=1, sp=True)
    te = replace(BF16, fused_norms=True)
    serial = ring_kv_exchange_time(LAYER, 8192, 1, strategy, replace(H100, grad_overlap=0.0), te, regather=False)
    once = kv_exchange_time(LAYER, 8192, 1, strategy, H100, 2, gathers=1)
    gather = (kv_exchange_time(LAYER, 8192, 1, strategy, H100, 2, gathers=2) - once)
    assert serial == pytest.approx(once + gather, rel=1e-12)  # the backward's extra pass of K and V
    short = ring_kv_exchange_time(LAYER, 8192, 1, strategy, H100, te, regather=False)
    long = ring_kv_exchange_time(LAYER, 262144, 1, strategy, H100, te, regather=False)
    assert 0 < short < serial and long == 0.0  # at 256K tokens the core covers every transfer
    assert layer_cost(LAYER, strategy, 1, 8192, H100, te).cp_comm_s == short
