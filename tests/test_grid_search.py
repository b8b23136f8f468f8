"""The exhaustive grid over Megatron's flags agrees with search_plan's megatron space on small jobs."""
from dataclasses import replace

import pytest

from megatron_auto.errors import UserError
from megatron_auto.search import search_plan
from megatron_auto.search.grid import grid_search, grid_splits, recompute_variants
from megatron_auto.search.uniform import UniformConfig
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import GIB, TrainingSpec

MODEL = uniform_model("grid-test", 4, 512, 8, seq_length=512, vocab_size=4096)
# No memory outside the model's tensors and no reserve or margin, so that the small budgets below
# bind on the layers' choices as they were tuned to.
CLUSTER = replace(CLUSTER_PRESETS["dgx-a100-80gb"], num_nodes=1, gpus_per_node=4, framework_overhead_bytes=0,
                  cuda_context_bytes=0, nccl_communicator_bytes=0, allocator_reserve_fraction=0.0,
                  memory_margin=0.0)


def _search_time(training: TrainingSpec) -> float:
    try:
        return search_plan(MODEL, CLUSTER, training, "megatron").plan.prediction.iteration_time_s
    except UserError:
        return float("inf")


@pytest.mark.parametrize("budget_gib", [0.08, 0.1, 0.13, 0.2, 40.0])
def test_grid_equals_megatron_search(budget_gib):
    training = TrainingSpec(global_batch_size=8, memory_budget_bytes=int(budget_gib * GIB))
    grid = grid_search(MODEL, CLUSTER, training)
    assert grid.evaluated > 100
    assert grid.time_s == pytest.approx(_search_time(training), rel=1e-12)
    if grid.plan is not None:
        assert grid.plan.prediction.fits


@pytest.mark.parametrize("budget_gib", [0.1, 0.13, 0.2, 0.4])
def test_recompute_bounds_change_nothing(budget_gib):
    model = uniform_model("grid-bound", 8, 512, 8, seq_length=512, vocab_size=4096)
    training = TrainingSpec(global_batch_size=8, memory_budget_bytes=int(budget_gib * GIB))
    bounded = grid_search(model, CLUSTER, training)
    full = grid_search(model, CLUSTER, training, use_bound=False)
    assert full.bounded == 0
    if budget_gib >= 0.2:  # something fits early, so the bounds bite
        assert bounded.bounded > 0 and bounded.evaluated < full.evaluated
    assert bounded.time_s == full.time_s and bounded.config == full.config


def test_grid_covers_every_megatron_split_and_recompute_count():
    model = uniform_model("grid-split", 8, 512, 8, seq_length=512, vocab_size=4096)
    assert grid_splits(model, 2, None) == [None] + [(f, 8 - f) for f in (1, 2, 3, 5, 6, 7)]
    assert len(grid_splits(model, 2, 1)) == 3
    variants = recompute_variants(UniformConfig(tp=1, pp=2, micro_batch_size=1), model)
    assert [(c.recompute, c.recompute_num_layers) for c in variants] == (
        [("selective", None), ("full", 1), ("full", 2), ("full", 3), ("full", None)])


def test_grid_equals_megatron_search_when_block_recompute_wins():
    model = uniform_model("grid-block", 8, 512, 8, seq_length=512, vocab_size=4096)
    training = TrainingSpec(global_batch_size=8, memory_budget_bytes=int(0.13 * GIB))
    grid = grid_search(model, CLUSTER, training)
    assert (grid.config.recompute, grid.config.recompute_num_layers) == ("full", 7)
    searched = search_plan(model, CLUSTER, training, "megatron").plan.prediction.iteration_time_s
    assert grid.time_s == pytest.approx(searched, rel=1e-12)


class _Fits:
    """A stand-in plan for the bisection: only `prediction.fits` is read."""

    def __init__(self, layers: int, fits: bool):
        self.layers, self.prediction = layers, type("P", (), {"fits": fits})()


def test_bisection_goes_below_a_pruned_middle():
    from megatron_auto.search.megatron_space import _fewest_recomputed_layers

    # 2 or more recomputed layers fit; 4 or more cannot beat the incumbent (pruned: None).
    def evaluate(n):
        return None if n >= 4 else _Fits(n, n >= 2)

    assert _fewest_recomputed_layers(evaluate, 8).layers == 2
    assert _fewest_recomputed_layers(lambda n: None if n >= 1 else _Fits(n, False), 8) is None


def test_block_recompute_under_interleaving_is_found_as_the_grid_finds_it():
    # llama2-70b on 64 H100s under 40 GiB: at t4 p16 the grid's best recomputes 2 layers per stage at v=1,
    # while 1 layer per chunk fits only at v=5 (5 chunks, so every layer recomputed, and slower): the
    # fewest layers per chunk that fit is not the best unless each chunk count is bisected on its own.
    from megatron_auto.search.constraints import SearchConstraints
    from megatron_auto.search.grid import grid_search_degrees
    from megatron_auto.specs import load_cluster, load_model

    model, cluster = load_model("llama2-70b"), load_cluster("dgx-h100-80gb", 8)
    training = TrainingSpec(global_batch_size=512, memory_budget_bytes=40 * GIB)
    grid = grid_search_degrees(model, cluster, training, 4, 16, split_window=0)
    found = search_plan(model, cluster, training, "megatron", SearchConstraints(tp=4, pp=16)).plan
    assert grid.plan is not None and grid.plan.prediction.fits
    assert found.prediction.iteration_time_s <= grid.plan.prediction.iteration_time_s * (1 + 1e-12)


# A small MoE model: a dense first layer, then three layers of 8 SwiGLU experts (top-2), no biases, so that
# every expert tensor-parallel degree is valid too.
MOE_MODEL = uniform_model("grid-moe", 4, 512, 8, seq_length=512, vocab_size=4096, swiglu=True, add_bias_linear=False,
                          normalization="RMSNorm", ffn_hidden_size=1024, num_experts=8, moe_router_topk=2,
                          moe_layer_freq=[0, 1, 1, 1])


@pytest.mark.parametrize("budget_gib", [0.2, 0.22, 0.25, 0.3, 40.0])
def test_grid_with_expert_parallel_equals_megatron_search(budget_gib):
    training = TrainingSpec(global_batch_size=8, memory_budget_bytes=int(budget_gib * GIB))
    grid = grid_search(MOE_MODEL, CLUSTER, training)
    assert grid.plan is not None and grid.plan.prediction.fits
    searched = search_plan(MOE_MODEL, CLUSTER, training, "megatron").plan
    assert grid.time_s == pytest.approx(searched.prediction.iteration_time_s, rel=1e-12)
    # Expert parallelism wins here (the grid had every ep, the search's rules must not have lost it).
    assert grid.config.ep > 1
    moe_strategies = {s for layer, s in zip(MOE_MODEL.layers, searched.layer_strategies) if layer.moe}
    assert len(moe_strategies) >= 1 and all(s.ep > 1 for s in moe_strategies)


def test_grid_enumerates_every_expert_degree_megatron_accepts():
    from megatron_auto.search.experts import expert_degree_choices

    # 4 GPUs at tp 2: etp in {1, 2 (= tp, written None), 4}; ep divides 8 experts and 4 / etp.
    assert sorted(expert_degree_choices(MOE_MODEL, 2, 4), key=str) == sorted(
        [(1, 1), (2, 1), (4, 1), (1, None), (2, None), (1, 4)], key=str)
    dense = uniform_model("dense", 2, 512, 8, seq_length=512, vocab_size=4096)
    assert expert_degree_choices(dense, 2, 4) == [(1, None)]


def test_counting_embedding_and_loss_in_the_split_gives_interleaved_plans_both_searches_find(monkeypatch, tmp_path):
    """14 layers over 2 stages split 7 + 7: interleaved chunks of 7 or 1 only. With the embedding and the loss
    counted as layers (--account-for-embedding/loss-in-pipeline-split), 16 split into 2 x 2 chunks of 4, the
    first and last one layer short; on this job that schedule beats every plan without it, and the grid
    and the megatron search find the same one. The nodes share two 400 Gb/s NICs (12.5 GB/s a GPU), so that
    data parallelism across them costs enough for the pipeline to win, while the interleaved schedule's fill and
    drain still wait little on the transfers between the nodes (cost.estimate.interleaved_chain_p2p)."""
    import megatron_auto.search.grid as grid_module
    import megatron_auto.search.megatron_space as space_module
    from megatron_auto.megatron_flags import megatron_flags
    from megatron_auto.plan import load_plan, save_plan
    from megatron_auto.runtime.layout import layout_from_plan

    model = uniform_model("account-for", 14, 4096, 32, seq_length=2048, vocab_size=51200)
    h100 = CLUSTER_PRESETS["dgx-h100-80gb"]
    cluster = replace(h100, num_nodes=2, inter_node=replace(h100.inter_node, bandwidth_bytes_per_s=12.5e9))
    training = TrainingSpec(global_batch_size=16)
    grid = grid_search(model, cluster, training, split_window=1)
    searched = search_plan(model, cluster, training, "megatron").plan
    assert grid.config.account_for == (True, True) and grid.config.vp == 2
    assert searched.prediction.iteration_time_s == pytest.approx(grid.time_s, rel=1e-12)
    assert [len(c.layers) for c in searched.chunks] == [3, 4, 4, 3]
    line = megatron_flags(searched)
    assert line[line.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(line)
    # What --auto-parallel-plan runs: the plan file gives the same chunks, and Megatron-Core's settings.
    save_plan(searched, tmp_path / "plan.json")
    layout = layout_from_plan(load_plan(tmp_path / "plan.json"))
    assert (layout.dims.vp, layout.account_for_embedding, layout.account_for_loss) == (2, True, True)
    for module in (grid_module, space_module):
        monkeypatch.setattr(module, "ACCOUNTED", ())
    without = search_plan(model, cluster, training, "megatron").plan
    assert without.prediction.iteration_time_s > searched.prediction.iteration_time_s
    assert grid_search(model, cluster, training, split_window=1).time_s == without.prediction.iteration_time_s


@pytest.mark.parametrize("layers, pp, account_for, v, sizes", [
    (14, 2, (True, True), 4, (1, 2, 2, 2, 2, 2, 2, 1)),
    (7, 2, (False, True), 2, (2, 2, 2, 1)),
    (7, 2, (False, True), 1, (4, 3)),
    (14, 2, (True, True), 8, None),      # chunks of 1: the first would hold no layer
    (14, 2, (False, False), 7, (1,) * 14),
    (14, 4, (False, False), 2, None),    # 14 layers do not split evenly over 4 stages
])
def test_chunk_sizes_follow_megatron_core_s_split(layers, pp, account_for, v, sizes):
    from megatron_auto.search.uniform import chunk_sizes, virtual_stage_choices

    model = uniform_model("chunks", layers, 512, 8, seq_length=512, vocab_size=4096)
    config = UniformConfig(tp=1, pp=pp, micro_batch_size=1, vp=v, account_for=account_for)
    assert chunk_sizes(layers, config) == sizes
    choices = virtual_stage_choices(model, config)
    assert (v in choices) == (sizes is not None and (v > 1 or not any(account_for)))
