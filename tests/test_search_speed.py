"""Issue 37, item 6: the stage floors and shared caches that make the megatron-space search fast change no plan.

The floors (search/stage_bound.py) must stay below what estimate_plan predicts, the facts they rest on must hold
on the preset layers, the caches must return what the uncached functions return, and the search must return the
same plan with them (search.pruning) as without them.
"""
import itertools
from dataclasses import replace

import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.layer_cost import kept_activation_bytes, layer_cost
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.search import pruning, search_plan
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.search.experts import expert_degree_choices, with_experts
from megatron_auto.search.megatron_space import SpaceStats, _base_configs
from megatron_auto.search.module_sets import candidate_module_sets
from megatron_auto.search.stage_bound import layer_shapes, layer_terms, set_free
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan, virtual_stage_choices
from megatron_auto.search.uniform_floors import _bound_work, candidate_floors, cannot_fit
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.model import ModelSpec

GIB = 2**30
SEARCH_JOBS = [
    # (model, cluster, nodes, global batch, memory budget GiB or 0): small jobs, some memory-bound so that
    # selective and full recomputation, and the memory floors, decide the plan.
    ("gpt3-1.7b", "dgx-a100-80gb", 1, 64, 8),
    ("gpt3-1.7b", "dgx-a100-80gb", 1, 64, 7),  # its plan recomputes 15 of 24 layers in full: the bisection decides
    ("llama2-7b", "dgx-h100-80gb", 1, 32, 22),
    ("tiny-deepseek-moe", "dgx-h100-80gb", 2, 64, 0),
    ("tiny-mixtral", "dgx-h100-80gb", 1, 64, 0),
    ("tiny-gpt", "cpu-gloo", 1, 16, 0),
]


def _job(name, cluster, nodes, batch, gib):
    return (load_model(name), load_cluster(cluster, nodes),
            TrainingSpec(batch, memory_budget_bytes=int(gib * GIB)))


@pytest.mark.parametrize("job", SEARCH_JOBS, ids=[f"{job[0]}-{job[-1]}gib" for job in SEARCH_JOBS])
def test_pruned_search_returns_the_unpruned_plan(job):
    model, cluster, training = _job(*job)
    fast = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    with pruning.unpruned():
        slow = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    assert fast.plan == slow.plan
    assert fast.plan.prediction.iteration_time_s == slow.plan.prediction.iteration_time_s
    assert fast.candidates_evaluated <= slow.candidates_evaluated


def test_switch_restores_itself():
    assert pruning.enabled()
    with pruning.unpruned():
        assert not pruning.enabled()
    assert pruning.enabled()


def _configs(model: ModelSpec, cluster, training, cp: int = 1):
    """Flag sets of every recompute kind (full with a recomputed-layer count too) over small layouts."""
    world = cluster.world_size
    for tp, pp in itertools.product((1, 2, 4), (1, 2, 4)):
        if world % (tp * pp * cp) or tp > cluster.gpus_per_node or model.layers[0].tensor_parallel_error(tp):
            continue
        dp = world // (tp * pp * cp)
        for (ep, etp), distributed in itertools.product(expert_degree_choices(model, tp, tp * cp * dp)[:3],
                                                        (False, True)):
            base = UniformConfig(tp=tp, pp=pp, micro_batch_size=1, sequence_parallel=tp > 1,
                                 distributed_optimizer=distributed, ep=ep, etp=etp,
                                 cp=cp)
            for recompute, layers in (("none", None), ("selective", None), ("full", None), ("full", 1)):
                yield replace(base, recompute=recompute, recompute_num_layers=layers)


FLOOR_JOBS = [("deepseek-v2-lite", "dgx-h100-80gb", 1, 64, 40, 1), ("llama2-7b", "dgx-h100-80gb", 1, 32, 22, 1),
              ("llama2-7b", "dgx-h100-80gb", 1, 32, 16, 2), ("tiny-deepseek-moe", "dgx-h100-80gb", 1, 32, 0, 1)]


@pytest.mark.parametrize("job", FLOOR_JOBS, ids=[f"{job[0]}-cp{job[-1]}" for job in FLOOR_JOBS])
def test_stage_floors_never_exceed_the_estimate(job):
    *spec, cp = job
    model, cluster, base_training = _job(*spec)
    sets = candidate_module_sets(model, base_training)
    checked = unfit = 0
    for config, modules in itertools.product(_configs(model, cluster, base_training, cp), sets[:4]):
        training = replace(base_training, recompute_modules=modules)
        dp = cluster.world_size // (config.tp * config.pp * cp)
        for mbs, v in itertools.product((1, 2, 4), virtual_stage_choices(model, config)):
            sized = replace(config, micro_batch_size=mbs, vp=v)
            try:
                plan = build_uniform_plan(model, cluster, training, sized)
                prediction = estimate_plan(plan, model, cluster, training)
            except UserError:
                continue
            floors = candidate_floors(model, cluster, training, sized, v, memory=True)
            assert floors is not None and training.global_batch_size % (mbs * dp) == 0
            assert floors.time_s <= prediction.iteration_time_s
            if cannot_fit(model, cluster, training, sized, floors):  # under a recomputed-layer count too
                assert not prediction.fits
                unfit += 1
            checked += 1
    assert checked > 50 and (unfit > 0) == (spec[-1] > 0)  # the budgeted jobs overflow somewhere


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x7b", "llama3-70b", "tiny-deepseek-moe", "gpt3-1.7b"])
def test_recomputation_only_adds_time(name):
    """What the floors without recomputation (and pipeline_lower_bound) rest on: on every layer shape, every
    recompute kind and --recompute-modules set prices the layer at least as slow as no recomputation."""
    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 1)
    training = TrainingSpec(64)
    for layer, tp, samples in itertools.product(layer_shapes(model), (1, 2), (1, 4)):
        if layer.tensor_parallel_error(tp):
            continue
        strategy = with_experts(layer, LayerStrategy(tp=tp, dp=8 // tp, sp=tp > 1), 2 if layer.moe else 1, None)
        plain = layer_cost(layer, strategy, samples, model.seq_length, cluster, training).micro_batch_s
        full = replace(strategy, recompute="full")
        assert layer_cost(layer, full, samples, model.seq_length, cluster, training).micro_batch_s >= plain
        for modules in candidate_module_sets(model, training):
            selective = replace(training, recompute_modules=modules)
            cost = layer_cost(layer, replace(strategy, recompute="selective"), samples, model.seq_length, cluster,
                              selective)
            assert cost.micro_batch_s >= plain


def test_layer_terms_share_prices_across_module_sets_exactly():
    """layer_terms prices a selectively recomputed layer under the first training spec whose set re-runs the
    same modules of it: the costs equal those of the spec asked about."""
    model, cluster = load_model("deepseek-v2-lite"), load_cluster("dgx-h100-80gb", 1)
    base = TrainingSpec(64)
    strategy = LayerStrategy(tp=2, dp=4, sp=True)
    for modules in candidate_module_sets(model, base):
        training = replace(base, recompute_modules=modules)
        seconds, states, activations = layer_terms(model, cluster, training, strategy, "selective", (2, None), 2)
        for index, layer in enumerate(layer_shapes(model)):
            direct = layer_cost(layer, with_experts(layer, replace(strategy, recompute="selective"), 2, None), 2,
                                model.seq_length, cluster, training)
            assert (seconds[index], states[index], activations[index]) == \
                (direct.micro_batch_s, direct.state_bytes, direct.activation_bytes)


def test_bound_work_is_the_sum_it_memoises():
    model, cluster, training = load_model("tiny-deepseek-moe"), load_cluster("dgx-h100-80gb", 1), TrainingSpec(32)
    strategy = LayerStrategy(tp=2, dp=4, sp=True)
    work, _ = _bound_work(model, cluster, training, strategy, (4, 1), 2)
    expected = sum(layer_cost(layer, with_experts(layer, strategy, 4, 1), 2, model.seq_length, cluster,
                              training).micro_batch_s for layer in model.layers)
    assert work == pytest.approx(expected, rel=1e-12)


def test_shared_base_configs_equal_the_unshared_ones():
    model, cluster = load_model("tiny-mixtral"), load_cluster("dgx-h100-80gb", 1)
    training = TrainingSpec(64, recompute_modules=("moe",))
    assert set_free(training) != training
    for degrees in ((1, 1, 1), (2, 2, 1), (1, 4, 1)):
        shared, plain = SpaceStats(), SpaceStats()
        fast = _base_configs(model, cluster, training, SearchConstraints(), degrees, shared)
        with pruning.unpruned():
            slow = _base_configs(model, cluster, training, SearchConstraints(), degrees, plain)
        assert fast == slow and shared.pruning == plain.pruning


def test_the_bisection_skips_layer_counts_on_the_memory_floor(monkeypatch):
    """Full recomputation's bisection (megatron_space._fewest_recomputed_layers) leaves unpriced the layer counts
    whose memory floor overflows, and the search still finds the unpruned plan (test above, gpt3-1.7b at 7 GiB)."""
    from megatron_auto.search import megatron_space

    verdicts = []

    def counted(model, cluster, training, config, layers):
        verdicts.append((layers, floor_overflows(model, cluster, training, config, layers)))
        return verdicts[-1][1]

    floor_overflows = megatron_space._floor_overflows
    monkeypatch.setattr(megatron_space, "_floor_overflows", counted)
    model, cluster, training = _job("gpt3-1.7b", "dgx-a100-80gb", 1, 64, 7)
    plan = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True).plan
    assert any(verdict for layers, verdict in verdicts if layers is not None)
    assert any(verdict for layers, verdict in verdicts if layers is None)
    recomputed = sum(layer.recompute == "full" for layer in plan.chunks[0].layers)
    assert 0 < recomputed < len(plan.chunks[0].layers)


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x7b", "tiny-deepseek-moe"])
def test_the_dense_part_reads_no_expert_degree(name):
    """layer_cost prices a MoE layer's dense part once for every (ep, etp) (cost.layer_cost.dense_view): the
    dense part priced with the expert degrees equals the one priced without them."""
    from megatron_auto.cost.layer_cost import dense_part_cost, dense_view

    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 2)
    training = TrainingSpec(64, precision="fp8")
    checked = 0
    for layer, tp in itertools.product([shape for shape in layer_shapes(model) if shape.moe], (1, 2)):
        for (ep, etp), recompute in itertools.product(expert_degree_choices(model, tp, 16)[:6], ("none", "full")):
            strategy = with_experts(layer, LayerStrategy(tp=tp, dp=16 // tp, sp=tp > 1, recompute=recompute), ep, etp)
            assert dense_part_cost(layer, strategy, 2, model.seq_length, cluster, training) == \
                dense_part_cost(layer, dense_view(strategy), 2, model.seq_length, cluster, training)
            checked += 1
    assert checked >= 4


def test_flags_whose_selective_recomputation_never_fits_are_skipped_with_the_same_plan():
    """megatron_space._no_selective_fits: on a memory-bound job the rule fires, and the plan is the one the search
    finds without the floors (test_pruned_search_returns_the_unpruned_plan checks the same job's plan)."""
    model, cluster, training = _job("gpt3-1.7b", "dgx-a100-80gb", 1, 64, 7)
    fast = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    with pruning.unpruned():
        slow = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    assert dict(fast.pruning).get("selective-never-fits", 0) > 0
    assert "selective-never-fits" not in dict(slow.pruning)
    assert fast.plan == slow.plan


@pytest.mark.parametrize("name", ["deepseek-v3", "tiny-deepseek-moe"])
def test_expert_terms_read_no_data_parallel_degree(name):
    """cost.moe._per_micro_batch_terms is memoised on LayerStrategy.per_micro_batch_key: priced afresh at one dp, each
    term equals the memo's entry filled at another."""
    from megatron_auto.cost import moe

    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 4)
    training = TrainingSpec(256, recompute_modules=("moe_act",), moe_grouped_gemm=True)
    layer = next(shape for shape in layer_shapes(model) if shape.moe)
    for recompute, (first_dp, zero), (other_dp, other_zero) in itertools.product(
            ("none", "selective", "full"), [(16, 1)], [(4, 0), (32, 1)]):
        def strategy(dp, zero_stage):
            return with_experts(layer, LayerStrategy(tp=1, dp=dp, zero=zero_stage, recompute=recompute), 4, 1)
        moe._per_micro_batch_terms.cache_clear()
        fresh = moe._per_micro_batch_terms(layer, strategy(other_dp, other_zero), 2, model.seq_length, cluster,
                                           training)
        moe._per_micro_batch_terms.cache_clear()
        moe._per_micro_batch_terms(layer, strategy(first_dp, zero), 2, model.seq_length, cluster, training)
        assert moe._per_micro_batch_terms(layer, strategy(other_dp, other_zero), 2, model.seq_length, cluster,
                                          training) == fresh


def test_uniform_config_but_is_replace():
    config = UniformConfig(tp=2, pp=4, micro_batch_size=1, sequence_parallel=True, ep=2)
    changed = config.but(vp=2, recompute="full", recompute_num_layers=3)
    assert changed == replace(config, vp=2, recompute="full", recompute_num_layers=3)
    assert hash(changed) == hash(replace(config, vp=2, recompute="full", recompute_num_layers=3))
    assert config.vp == 1 and config.recompute == "none"
    with pytest.raises(TypeError, match="no field 'virtual_stages'"):
        config.but(virtual_stages=2)


def test_set_free_gives_one_object_for_equal_specs():
    """stage_bound.set_free memoises by identity and cost.layer_cost interns what it returns: equal training specs,
    whatever their --recompute-modules set, map to one object, so the caches keyed on it match by identity."""
    first, second = TrainingSpec(64, recompute_modules=("mlp",)), TrainingSpec(64, recompute_modules=("moe",))
    free = set_free(first)
    assert free == replace(first, recompute_modules=TrainingSpec(64).recompute_modules)
    assert set_free(second) is free and set_free(free) is free and set_free(first) is free


def test_with_prediction_is_replace():
    model, cluster, training = load_model("tiny-gpt"), load_cluster("cpu-gloo", 1), TrainingSpec(16)
    plan = build_uniform_plan(model, cluster, training, UniformConfig(tp=2, pp=2, micro_batch_size=2))
    prediction = estimate_plan(plan, model, cluster, training)
    priced = plan.with_prediction(prediction)
    assert priced == replace(plan, prediction=prediction) and priced.prediction is prediction
    assert plan.prediction is None


@pytest.mark.parametrize("name,precision,extra", [
    ("deepseek-v3", "bf16", {}), ("deepseek-moe-16b", "bf16", {}), ("tiny-deepseek-moe", "bf16", {}),
    ("llama3-70b", "fp8", {"tp_comm_overlap": True}), ("mixtral-8x7b", "bf16", {"moe_ep_overlap": True}),
    ("gpt3-1.7b", "bf16", {"cuda_graph_impl": "transformer_engine"}),
])
def test_a_layers_micro_batch_seconds_read_no_dp_below_zero3(name, precision, extra):
    """The search's memos of a layer's per-micro-batch terms key on LayerStrategy.per_micro_batch_key, without dp
    and the ZeRO stage below ZeRO-3 (uniform_floors._bound_work, stage_bound.least_selective_kept_bytes): a
    layer's micro_batch_s, compute seconds and kept activations must not read them (CP, experts, FP8, TP
    overlap, CUDA graphs included)."""
    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 16)
    training = replace(TrainingSpec(512, precision=precision), **extra)
    checked = 0
    for layer, tp, cp, recompute, samples in itertools.product(layer_shapes(model), (1, 2, 8), (1, 2),
                                                               ("none", "selective", "full"), (1, 2)):
        if layer.tensor_parallel_error(tp) or (cp > 1 and (layer.mla is not None or model.mtp_num_layers)):
            continue
        seen = set()
        for dp, zero in ((8, 0), (8, 1), (4, 1), (16, 0), (16, 2)):
            for ep, etp in expert_degree_choices(model, tp, tp * cp * dp)[:3] if layer.moe else [(1, None)]:
                strategy = with_experts(layer, LayerStrategy(tp=tp, dp=dp, cp=cp, zero=zero, sp=tp > 1,
                                                             recompute=recompute), ep, etp)
                cost = layer_cost(layer, strategy, samples, model.seq_length, cluster, training)
                kept = kept_activation_bytes(layer, strategy, samples, model.seq_length, cluster, training)
                seen.add((ep, etp, cost.micro_batch_s, cost.forward_s + cost.backward_s + cost.recompute_s, kept))
        per_experts = {}
        for ep, etp, *values in seen:
            per_experts.setdefault((ep, etp), set()).add(tuple(values))
        assert all(len(values) == 1 for values in per_experts.values()), (layer, tp, cp, recompute, per_experts)
        checked += 1
    assert checked >= 12
