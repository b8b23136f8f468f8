"""The planner chooses what selective recomputation re-runs (search.module_sets): the fastest fitting plan over
every --recompute-modules set the model can run, equal to searching each set on its own."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.job import training_spec
from megatron_auto.cli.main import main
from megatron_auto.cli.parser import build_parser
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
from megatron_auto.errors import UserError
from megatron_auto.search import SearchConstraints, search_plan
from megatron_auto.search.module_sets import candidate_module_sets
from megatron_auto.specs import TrainingSpec, load_cluster, load_model
from megatron_auto.specs.training import GIB

H100 = load_cluster("dgx-h100-80gb", 1)


def test_candidates_are_the_sets_the_model_can_run_each_once():
    llama, gpt, mixtral = (load_model(name) for name in ("llama2-7b", "gpt3-1.7b", "mixtral-8x7b"))
    assert len(candidate_module_sets(llama, TrainingSpec(64))) == 7
    assert candidate_module_sets(llama, TrainingSpec(64, recompute_modules=("mlp",)))[0] == ("mlp",)
    # GPT's linear biases rule out mlp (specs.training.recompute_modules_problem).
    assert candidate_module_sets(gpt, TrainingSpec(64)) == [("core_attn",), ("layernorm",), ("core_attn", "layernorm")]
    # Every Mixtral layer is MoE, whose MLP Megatron-Core never recomputes, and none has a shared expert: mlp
    # and shared_experts add nothing to any set; moe re-runs the routed experts.
    assert candidate_module_sets(mixtral, TrainingSpec(64)) == [
        ("core_attn",), ("layernorm",), ("moe",), ("core_attn", "layernorm"), ("core_attn", "moe"),
        ("layernorm", "moe"), ("core_attn", "layernorm", "moe")]


def test_transformer_engines_fused_norms_leave_layernorm_out():
    # TE's spec fuses each norm into the next GEMM; megatron-core then recomputes no norm, and the search does
    # not count on it (specs.training.TrainingSpec.fused_norms).
    fused = TrainingSpec(64, fused_norms=True)
    assert candidate_module_sets(load_model("llama2-7b"), fused) == [("core_attn",), ("mlp",), ("core_attn", "mlp")]
    assert candidate_module_sets(load_model("gpt3-1.7b"), fused) == [("core_attn",)]
    assert fused.selective_modules(load_model("llama2-7b").layers[0]) == {"core_attn"}
    layernorm = replace(fused, recompute_modules=("layernorm",))
    model = load_model("llama2-7b")
    priced = {kind: estimate_plan(plan_from_flags(model, 8, ManualParallelism(
        tp=2, micro_batch_size=2, global_batch_size=64, recompute_granularity=kind)),
        model, H100, layernorm) for kind in (None, "selective")}
    assert priced["selective"].peak_memory_gib == priced[None].peak_memory_gib
    assert priced["selective"].iteration_time_s == priced[None].iteration_time_s
    local = estimate_plan(plan_from_flags(model, 8, ManualParallelism(
        tp=2, micro_batch_size=2, global_batch_size=64, recompute_granularity="selective")),
        model, H100, replace(layernorm, fused_norms=False))
    assert local.peak_memory_gib < priced[None].peak_memory_gib  # the local spec's norms are freed


def test_the_command_line_prices_transformer_engine_on_gpus_unless_told_otherwise():
    args = build_parser().parse_args(["plan", "--model", "llama2-7b", "--cluster", "dgx-h100-80gb",
                                      "--global-batch-size", "64"])
    assert training_spec(args, "dgx-h100-80gb", 64).fused_norms
    assert not training_spec(args, "cpu-gloo", 64).fused_norms
    args.transformer_impl = "local"
    assert not training_spec(args, "dgx-h100-80gb", 64).fused_norms


# Each case: model, global batch, memory budget GiB (0: the device's), space, nodes.
CASES = [("llama2-7b", 64, 0, "megatron", 1), ("llama2-7b", 64, 0, "hybrid", 1), ("llama2-7b", 64, 60, "hybrid", 1),
         ("gpt3-1.7b", 64, 40, "hybrid", 1), ("mixtral-8x7b", 128, 0, "hybrid", 4)]


@pytest.mark.parametrize("name,batch,budget_gib,space,nodes", CASES)
def test_the_choice_is_the_fastest_of_searching_each_set_alone(name, batch, budget_gib, space, nodes):
    model, cluster = load_model(name), load_cluster("dgx-h100-80gb", nodes)
    # Mixtral as the command line prices a GPU cluster: Transformer Engine's fused norms.
    training = TrainingSpec(batch, memory_budget_bytes=budget_gib * GIB, fused_norms=name == "mixtral-8x7b")
    chosen = search_plan(model, cluster, training, space, choose_recompute_modules=True).plan
    alone = {modules: search_plan(model, cluster, replace(training, recompute_modules=modules), space).plan
             for modules in candidate_module_sets(model, training)}
    fastest = min(plan.prediction.iteration_time_s for plan in alone.values())
    assert chosen.prediction.iteration_time_s == pytest.approx(fastest, rel=1e-12)
    assert chosen.prediction.iteration_time_s == pytest.approx(
        alone[chosen.prediction.recompute_modules].prediction.iteration_time_s, rel=1e-12)


def test_recomputing_the_mlp_is_chosen_where_it_is_fastest():
    # Llama-2 7B on 8 H100s (hybrid space) held to 60 GiB a GPU: the plan that recomputes the MLP beats the
    # best with Megatron's default core_attn (flash attention leaves core_attn almost nothing to free).
    model, training = load_model("llama2-7b"), TrainingSpec(64, memory_budget_bytes=60 * GIB)
    chosen = search_plan(model, H100, training, "hybrid", choose_recompute_modules=True)
    default = search_plan(model, H100, training, "hybrid").plan
    assert chosen.plan.prediction.recompute_modules != ("core_attn",)
    assert chosen.plan.recomputes_selectively
    assert chosen.plan.prediction.iteration_time_s < default.prediction.iteration_time_s
    assert sum(1 for phase, _ in chosen.timings if phase.startswith("recompute modules ")) == 7


def test_a_pinned_granularity_other_than_selective_searches_one_set():
    model = load_model("llama2-7b")
    result = search_plan(model, H100, TrainingSpec(64), "megatron", SearchConstraints(recompute="full"),
                         choose_recompute_modules=True)
    assert [phase for phase, _ in result.timings if phase.startswith("recompute modules ")] == \
        ["recompute modules core_attn"]


def test_nothing_fits_under_any_set_is_the_usual_one_line():
    with pytest.raises(UserError, match=r"no plan fits in 1\.0 GiB per GPU; the least memory any plan needs is \d"):
        search_plan(load_model("llama2-7b"), H100, TrainingSpec(64, memory_budget_bytes=GIB), "megatron",
                    choose_recompute_modules=True)


def test_plan_chooses_the_modules_unless_they_are_given(capsys):
    base = ["plan", "--model", "llama2-7b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "64",
            "--memory-budget-gib", "20", "--space", "hybrid", "--json"]
    assert main(base) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert main(base + ["--recompute-modules", "core_attn"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert pinned["recompute_modules"] == ["core_attn"] and chosen["recompute_modules"] != ["core_attn"]
    assert chosen["iteration_time_s"] < pinned["iteration_time_s"]
