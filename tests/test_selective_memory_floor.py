"""Issue 37, item 6: the memory floor that every --recompute-modules set shares.

A selectively recomputed candidate whose layers, each keeping the least that any set leaves it, still overflow
the device cannot fit under any set: the search of each set drops it without pricing its layers under that set
(search/stage_bound.py least_selective_peak, uniform_floors.no_module_set_fits). These tests hold the pieces it
rests on: the activation bytes it reads are layer_cost's to the byte, the least is the least over the sets, an
unfit verdict is never given to a plan that fits, and the search returns the same plan with the floor as without.
"""
import itertools
from dataclasses import replace

import pytest

from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.layer_cost import kept_activation_bytes, layer_cost
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.search import pruning, search_plan
from megatron_auto.search import uniform_floors
from megatron_auto.search.experts import with_experts
from megatron_auto.search.module_sets import candidate_module_sets
from megatron_auto.search.stage_bound import layer_shapes, least_selective_kept_bytes
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan, virtual_stage_choices
from megatron_auto.search.uniform_floors import no_module_set_fits
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.training import RECOMPUTE_MODULES

GIB = 2**30
MODELS = ["deepseek-v2-lite", "tiny-deepseek-moe", "mixtral-8x7b", "llama2-70b", "gpt3-1.7b"]


def _strategies(layer, cps=(1,)):
    for tp, cp, recompute in itertools.product((1, 2, 8), cps, ("none", "selective", "full")):
        if layer.tensor_parallel_error(tp) or (cp > 1 and layer.mla is not None):
            continue
        yield with_experts(layer, LayerStrategy(tp=tp, dp=4, sp=tp > 1, recompute=recompute, cp=cp),
                           2 if layer.moe else 1, None)


@pytest.mark.parametrize("name", MODELS)
def test_kept_activation_bytes_are_layer_costs(name):
    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 1)
    checked = 0
    for fp8, fused, backend in itertools.product((False, True), (False, True), ("flash", "unfused")):
        base = TrainingSpec(64, precision="fp8" if fp8 else "bf16", fused_norms=fused, attention_backend=backend)
        for layer in layer_shapes(model):
            cps = (1, 2) if backend == "flash" else (1,)
            for strategy, modules in itertools.product(_strategies(layer, cps), candidate_module_sets(model, base)):
                training = replace(base, recompute_modules=modules)
                expected = layer_cost(layer, strategy, 2, model.seq_length, cluster, training).activation_bytes
                assert kept_activation_bytes(layer, strategy, 2, model.seq_length, cluster, training) == expected
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("backend", ["flash", "unfused"])
@pytest.mark.parametrize("name", MODELS)
def test_least_selective_kept_bytes_is_the_least_over_every_set(name, backend):
    """At most what any set keeps of each layer shape, and reached by one of them (the floor is tight)."""
    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", 1)
    training = TrainingSpec(64, attention_backend=backend)
    sets = [modules for size in range(1, len(RECOMPUTE_MODULES) + 1)
            for modules in itertools.combinations(RECOMPUTE_MODULES, size)]
    for tp in (1, 2):
        strategy = LayerStrategy(tp=tp, dp=4, sp=tp > 1)
        least = least_selective_kept_bytes(model, cluster, training, strategy, (2, None), 2)
        for index, layer in enumerate(layer_shapes(model)):
            if layer.tensor_parallel_error(tp):
                continue
            selective = with_experts(layer, replace(strategy, recompute="selective"), 2, None)
            kept = [layer_cost(layer, selective, 2, model.seq_length, cluster,
                               replace(training, recompute_modules=modules)).activation_bytes for modules in sets]
            assert least[index] == min(kept)


UNFIT_JOBS = [("llama2-7b", "dgx-h100-80gb", 1, 32, 22), ("deepseek-v2-lite", "dgx-h100-80gb", 1, 64, 40)]


@pytest.mark.parametrize("job", UNFIT_JOBS, ids=[job[0] for job in UNFIT_JOBS])
def test_no_set_fits_only_where_no_set_fits(job):
    """Wherever the shared floor says no set fits, the plan of every candidate set, priced, does not fit."""
    name, cluster_name, nodes, batch, gib = job
    model, cluster = load_model(name), load_cluster(cluster_name, nodes)
    base = TrainingSpec(batch, memory_budget_bytes=gib * GIB)
    fired = 0
    for tp, pp, mbs in itertools.product((1, 2, 4), (1, 2), (1, 2, 4)):
        config = UniformConfig(tp=tp, pp=pp, micro_batch_size=mbs, sequence_parallel=tp > 1,
                               distributed_optimizer=True, recompute="selective",
                               ep=2 if model.layers[-1].moe else 1)
        for v in virtual_stage_choices(model, config) or [1]:
            if not no_module_set_fits(model, cluster, base, config, v):
                continue
            fired += 1
            for modules in candidate_module_sets(model, base):
                training = replace(base, recompute_modules=modules)
                try:
                    plan = build_uniform_plan(model, cluster, training, replace(config, vp=v))
                except UserError:
                    continue
                assert not estimate_plan(plan, model, cluster, training).fits
    assert fired > 0


def test_the_search_skips_on_the_shared_floor_and_finds_the_unpruned_plan(monkeypatch):
    verdicts = []

    def counted(*args):
        verdicts.append(no_module_set_fits(*args))
        return verdicts[-1]

    monkeypatch.setattr(uniform_floors, "no_module_set_fits", counted)
    model, cluster = load_model("llama2-7b"), load_cluster("dgx-h100-80gb", 1)
    training = TrainingSpec(32, memory_budget_bytes=22 * GIB)
    fast = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    assert any(verdicts)
    with pruning.unpruned():
        slow = search_plan(model, cluster, training, "megatron", choose_recompute_modules=True)
    assert fast.plan == slow.plan
    assert fast.plan.prediction.iteration_time_s == slow.plan.prediction.iteration_time_s
