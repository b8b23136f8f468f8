"""Multi-token prediction's cost terms (cost/mtp.py): where they land, what they add, by hand where the
formula is independent of the code (SC21's layer FLOPs, ring collectives), and what the search does with them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.collectives import all_gather_time, all_reduce_time, reduce_scatter_time
from megatron_auto.cost.estimate import estimate_plan, stage_costs, stage_memory
from megatron_auto.cost.flops import Gemm, model_flops_per_iteration
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.memory import model_state_bytes
from megatron_auto.cost.models import comm_model, compute_model
from megatron_auto.cost.mtp import (embedding_cost, mtp_cost, mtp_layer_strategy, mtp_parameters_beside_layers,
                                    projection_comm_time)
from megatron_auto.errors import UserError
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import LayerStrategy, context_parallel_problem
from megatron_auto.search import search_plan
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

A100 = CLUSTER_PRESETS["dgx-a100-80gb"]   # analytic compute: GEMMs, no element-wise kernels
H100 = CLUSTER_PRESETS["dgx-h100-80gb"]   # kernel-level compute
TRAINING = TrainingSpec(global_batch_size=32)
GPT = uniform_model("gpt-mtp", 8, 2048, 16, 2048, 50304, position_embedding_type="rope")
LLAMA = uniform_model("llama-mtp", 8, 4096, 32, 4096, 128000, ffn_hidden_size=14336, swiglu=True,
                      normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                      untie_embeddings_and_output_weights=True)


def plan_and_stages(model, cluster=A100, **config):
    config = {"tp": 2, "pp": 2, "micro_batch_size": 2, **config}
    plan = build_uniform_plan(model, cluster, TRAINING, UniformConfig(**config))
    return plan, stage_costs(plan, model, cluster, TRAINING)


@pytest.mark.parametrize("depths", [1, 2])
@pytest.mark.parametrize("sp", [False, True])
def test_mtp_lands_on_the_last_stage_as_layers_and_a_part(depths, sp):
    plan, plain = plan_and_stages(GPT, sequence_parallel=sp)
    _, deep = plan_and_stages(replace(GPT, mtp_num_layers=depths), sequence_parallel=sp)
    assert deep[0] == plain[0]
    strategy = plan.layer_strategies[-1]
    layer = layer_cost(GPT.layers[-1], strategy, plan.local_micro_batch(strategy), GPT.seq_length, A100, TRAINING)
    part = deep[1].mtp
    assert deep[1].micro_batch_s - plain[1].micro_batch_s == pytest.approx(
        depths * layer.micro_batch_s + part.micro_batch_s, rel=1e-12)
    beside = mtp_parameters_beside_layers(replace(GPT, mtp_num_layers=depths), 2)
    assert deep[1].state_bytes - plain[1].state_bytes == pytest.approx(
        depths * layer.state_bytes + model_state_bytes(beside, plan.embedding, TRAINING), rel=1e-12)
    assert deep[1].activation_bytes - plain[1].activation_bytes == pytest.approx(depths * layer.activation_bytes)


def test_the_mtp_stage_adds_an_embedding_copy_only_beside_an_untied_head_on_another_stage():
    """Tied, the MTP stage's embedding copy is the output layer's weight, which the LM head's part counts."""
    model = replace(GPT, mtp_num_layers=1)
    per_module = 2 * 2048 * 2048 + 3 * 2 * 2048  # eh_proj, three LayerNorms (scale and shift)
    assert mtp_parameters_beside_layers(model, 1) == per_module
    assert mtp_parameters_beside_layers(model, 2) == per_module
    untied = replace(model, untie_embeddings_and_output_weights=True)
    assert mtp_parameters_beside_layers(untied, 1) == per_module
    assert mtp_parameters_beside_layers(untied, 2) == per_module + 50304 * 2048  # the word embedding (RoPE)


def test_one_depth_by_hand_without_tensor_parallelism():
    """tp 1 on the analytic model: the shifted tokens' embedding, the LM head and loss once more, and eh_proj's
    GEMMs (tokens x 2h x h, backward twice the forward); no TP traffic."""
    model = replace(GPT, mtp_num_layers=1)
    strategy = LayerStrategy(tp=1, dp=8)
    part = mtp_cost(model, strategy, 2, A100, TRAINING, 1)
    parts = embedding_cost(model, strategy, 2, A100, TRAINING, 1)
    gemm = compute_model(A100).gemm_time(Gemm(2 * 2048, 2 * 2048, 2048), A100)
    assert part.micro_batch_s == pytest.approx(parts.embedding.micro_batch_s + parts.head.micro_batch_s + 3 * gemm)
    assert part.tp_comm_s == 0.0
    assert part.loss_bytes == 4 * 2 * 2048 * 50304  # the depth's fp32 softmax


@pytest.mark.parametrize("sp", [False, True])
def test_projection_traffic_by_hand(sp):
    """Without SP: the h/t outputs' all-gather, the 2h input gradient's all-reduce. With SP: the 2h input's
    all-gather and its re-gather in backward (exposed as tp_comm_time's re-gathers), the outputs' all-gather,
    the sequence split's backward all-gather and the 2h input gradient's reduce-scatter."""
    strategy = LayerStrategy(tp=4, dp=2, sp=sp)
    one = 2048 * 2 * 2048 * 2
    link = A100.link_for_group(4, 1)
    if sp:
        overlap = comm_model(A100).grad_overlap
        expected = (all_gather_time(2 * one, 4, link) * (2 - overlap) + 2 * all_gather_time(one, 4, link)
                    + reduce_scatter_time(2 * one, 4, link))
    else:
        expected = all_gather_time(one, 4, link) + all_reduce_time(2 * one, 4, link)
    assert projection_comm_time(GPT, strategy, 2, A100, 2) == pytest.approx(expected, rel=1e-12)


def test_mtp_softmaxes_wait_beside_the_main_one():
    model = replace(LLAMA, mtp_num_layers=2)
    plan, plain = plan_and_stages(LLAMA, H100)
    _, deep = plan_and_stages(model, H100)
    logits = [stage_memory(plan, 1, stages[1], m, H100, TRAINING).logits for m, stages in ((LLAMA, plain),
                                                                                           (model, deep))]
    assert logits[1] - logits[0] == 2 * 4 * 4096 * plan.local_micro_batch(plan.embedding) * 128000 / 2


def test_full_recompute_reaches_mtp_layers_only_through_the_uniform_method():
    model = replace(GPT, mtp_num_layers=1)
    uniform, _ = plan_and_stages(model, recompute="full")
    assert mtp_layer_strategy(uniform).recompute == "full"
    block, _ = plan_and_stages(model, recompute="full", recompute_num_layers=2)
    assert {s.recompute for s in block.layer_strategies} == {"full", "none"}
    assert mtp_layer_strategy(block).recompute == "none"
    selective, _ = plan_and_stages(model, recompute="selective")
    assert mtp_layer_strategy(selective).recompute == "selective"


def test_flops_add_each_depth_as_megatron_lm_counts_it():
    """SC21's layer (24bsh^2 + 4bs^2h) plus eh_proj (2 x 2h x h per token) plus the logits (2hV per token),
    forward and backward (x3), per depth; the norms' 3h of Megatron-LM's count is left out as elsewhere."""
    b, s, h, v = 32, 2048, 2048, 50304
    per_depth = 24 * b * s * h * h + 4 * b * s * s * h + 4 * b * s * h * h + 2 * b * s * h * v
    for depths in (1, 3):
        delta = model_flops_per_iteration(replace(GPT, mtp_num_layers=depths), b) - model_flops_per_iteration(GPT, b)
        assert delta == pytest.approx(3 * depths * per_depth, rel=1e-12)


def test_the_search_moves_layers_off_the_mtp_stage():
    plain = search_plan(LLAMA, H100, TrainingSpec(global_batch_size=64), "megatron",
                        SearchConstraints(tp=2, pp=2)).plan
    deep_model = replace(LLAMA, mtp_num_layers=1)
    deep = search_plan(deep_model, H100, TrainingSpec(global_batch_size=64), "megatron",
                       SearchConstraints(tp=2, pp=2)).plan
    layers = [[len(c.layers) for c in p.chunks] for p in (plain, deep)]
    assert layers[1][-1] < layers[0][-1]
    assert deep.prediction.iteration_time_s > plain.prediction.iteration_time_s
    again = estimate_plan(deep, deep_model, H100, TrainingSpec(global_batch_size=64))
    assert again.iteration_time_s == pytest.approx(deep.prediction.iteration_time_s, rel=1e-12)


def test_mtp_is_refused_where_nothing_prices_or_runs_it():
    model = replace(LLAMA, mtp_num_layers=1)
    assert "multi-token prediction" in context_parallel_problem(2, model)
    with pytest.raises(UserError, match="hybrid space does not plan"):
        search_plan(model, H100, TrainingSpec(global_batch_size=64), "hybrid")


def test_a_standalone_mtp_chunk_moves_the_modules_to_its_stage_and_leaves_the_logits_with_the_loss():
    """Megatron-Core's standalone MTP (a layout "...|tm|L"): the MTP block runs in its own chunk, the output layer
    and every depth's cross entropy in the loss's (gpt_model.py: `mtp_process` and `post_process`). Two layouts
    with the same decoder layers per chunk, MTP beside the loss in one and a chunk before it in the other."""
    model = replace(GPT, mtp_num_layers=1)
    config = {"tp": 2, "pp": 4, "micro_batch_size": 2, "vp": 2, "chunk_layers": (1, 1, 1, 1, 1, 1, 2, 0)}
    beside, beside_stages = plan_and_stages(model, **config)
    alone, alone_stages = plan_and_stages(model, **config, mtp_chunk=6)
    assert beside.mtp_chunk is None and alone.mtp_chunk == 6
    moved = alone_stages[2].micro_batch_s - beside_stages[2].micro_batch_s
    assert moved > 0 and beside_stages[3].micro_batch_s - alone_stages[3].micro_batch_s == pytest.approx(moved)
    assert alone_stages[3].mtp_heads.loss_bytes == beside_stages[3].mtp.loss_bytes > 0  # the depths' softmaxes
    assert alone_stages[2].mtp.loss_bytes == 0
    copy = mtp_parameters_beside_layers(model, 4, standalone=True) - mtp_parameters_beside_layers(model, 4)
    assert copy == model.embedding_parameters  # tied: no output layer there, so the embedding is a copy
    flags = megatron_flags(alone)
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == "Et|t|t|t|t|t|t*2m|L"


@pytest.mark.parametrize("depths", [1, 2])
def test_after_a_standalone_mtp_chunk_the_main_and_mtp_hidden_states_travel_on_together(depths):
    """The MTP block concatenates the main model's and each depth's hidden states along the sequence and the stage
    sends them on to the loss's (multi_token_prediction.py; gpt_model.py splits them where post_process is set):
    1 + D sequences' worth over that boundary, one over the others. Without virtual stages nothing hides them."""
    from megatron_auto.cost.communication import pipeline_p2p_time

    model = replace(GPT, mtp_num_layers=depths)
    plan, stages = plan_and_stages(model, pp=4, chunk_layers=(2, 3, 3, 0), mtp_chunk=2)
    samples = plan.global_batch_size // plan.num_micro_batches

    def p2p(streams: int) -> float:
        return pipeline_p2p_time(model.hidden_size, model.seq_length, samples * streams, plan.gpus_per_stage, 4, A100,
                                 TRAINING.activation_bytes)

    assert [stage.pp_comm_s for stage in stages] == pytest.approx([p2p(1), p2p(1), p2p(1 + depths), 0.0])
    assert p2p(1 + depths) > p2p(1) * (1 + depths) * 0.9
    _, beside = plan_and_stages(model, pp=4, chunk_layers=(2, 3, 3, 0))
    assert beside[2].pp_comm_s == pytest.approx(p2p(1))  # MTP beside the loss: the boundary carries one sequence


@pytest.mark.parametrize("mtp_chunk, message", [(7, "stage other than the loss's"),  # the loss's own chunk
                                                (3, "stage other than the loss's"),  # not its stage's last chunk
                                                (5, "decoder layers come before the MTP layers")])
def test_a_standalone_mtp_chunk_follows_megatron_cores_rules(mtp_chunk, message):
    with pytest.raises(UserError, match=message):
        plan_and_stages(replace(GPT, mtp_num_layers=1), tp=2, pp=4, micro_batch_size=2, vp=2,
                        chunk_layers=(1, 1, 1, 1, 1, 1, 2, 0), mtp_chunk=mtp_chunk)
    with pytest.raises(UserError, match="decoder layers come before the MTP layers"):
        plan_and_stages(replace(GPT, mtp_num_layers=1), tp=2, pp=4, micro_batch_size=2, vp=2,
                        chunk_layers=(1, 1, 1, 1, 1, 1, 1, 1), mtp_chunk=6)
    with pytest.raises(UserError, match="has no MTP layers"):
        plan_and_stages(GPT, tp=2, pp=4, micro_batch_size=2, vp=2, chunk_layers=(1, 1, 1, 1, 1, 1, 2, 0),
                        mtp_chunk=6)


def test_estimate_reads_megatron_lms_deepseek_v3_layout_with_its_standalone_mtp_chunk(capsys):
    """Megatron-LM's documented DeepSeek-V3 layout (pipeline_parallel_layer_layout.py's example): the MTP layer in
    chunk 30, stage 14's last, the loss alone in chunk 31; written back as given."""
    import json

    from megatron_auto.cli.main import main

    layout = "Et*3|(tt|)*29,m|L"
    argv = ["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h100-80gb", "--num-nodes", "128",
            "--global-batch-size", "4096", "--tp", "2", "--pp", "16", "--ep", "64", "--etp", "1",
            "--sequence-parallel", "--micro-batch-size", "1", "--pipeline-model-parallel-layout", layout, "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["mtp_chunk"] == 30
    flags = data["megatron_flags"]
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1].endswith("|t*2|t*2|m|L")
    times = data["stage_time_s"]  # stages 14 and 15 hold 2 layers each, the others 4 (stage 0: 3 and the embedding)
    assert times[14] < times[13] and times[15] < times[13] and times[14] > min(times[1:14]) / 2


def test_the_report_names_the_mtp_modules_on_their_own_stage():
    from megatron_auto.report import plan_table

    model = replace(GPT, mtp_num_layers=1)
    config = {"tp": 2, "pp": 4, "micro_batch_size": 2, "vp": 2, "chunk_layers": (1, 1, 1, 1, 1, 1, 2, 0)}
    alone, _ = plan_and_stages(model, **config, mtp_chunk=6)
    assert (alone.mtp_stage, alone.loss_stage) == (2, 3)
    headers = [line for line in plan_table(alone).splitlines() if line.strip().startswith("stage ")]
    assert [("MTP module" in line) for line in headers] == [False, False, True, False]
