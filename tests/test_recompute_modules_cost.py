"""--recompute-modules in the planner: what selective recompute re-runs, priced in time and memory, and the
Megatron-LM flags that ask for it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.compute import layer_compute_times, module_forward_seconds, recompute_time
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import LayerStrategy
from megatron_auto.report import plan_table
from megatron_auto.runtime.layout import _parse_flags
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec, recompute_modules_problem

LLAMA = MODEL_PRESETS["llama2-7b"]
DENSE = LLAMA.layers[0]
MOE_SHARED = MODEL_PRESETS["deepseek-moe-16b"].layers[-1]  # 64 experts, top-6, a 2816-wide shared expert
A100 = CLUSTER_PRESETS["dgx-a100-80gb"]
H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
SELECTIVE = LayerStrategy(tp=2, dp=4, sp=True, recompute="selective")


def training(*modules: str) -> TrainingSpec:
    return TrainingSpec(global_batch_size=64, recompute_modules=modules or ("core_attn",))


@pytest.mark.parametrize("modules", [(), ("core_attn", "core_attn"), ("moe_ac",), ("mlp", "attention")])
def test_modules_must_be_distinct_known_names(modules):
    with pytest.raises(ValueError, match="recompute modules must be distinct names among core_attn, mlp, layernorm, "
                                         "moe, shared_experts"):
        TrainingSpec(global_batch_size=8, recompute_modules=modules)


def test_a_moe_layers_mlp_is_not_recomputed():
    spec = training("core_attn", "mlp")
    assert spec.selective_modules(DENSE) == {"core_attn", "mlp"}
    assert spec.selective_modules(MOE_SHARED) == {"core_attn"}


@pytest.mark.parametrize("modules, dense, moe, moe_shared", [
    (("shared_experts",), set(), set(), {"mlp"}),
    (("moe",), set(), {"moe"}, {"moe", "mlp"}),
    (("core_attn", "mlp", "moe"), {"core_attn", "mlp"}, {"core_attn", "moe"}, {"core_attn", "moe", "mlp"}),
])
def test_moe_modules_act_on_moe_layers_and_their_shared_expert(modules, dense, moe, moe_shared):
    """moe and shared_experts re-run nothing in a dense layer; in a MoE layer, the dense part's MLP (the
    shared expert, where there is one) is re-run by either, and the routed experts by moe."""
    spec = training(*modules)
    assert spec.selective_modules(DENSE) == dense
    assert spec.selective_modules(replace(MOE_SHARED, moe=replace(MOE_SHARED.moe, shared_expert_ffn_hidden_size=0))) \
        == moe
    assert spec.selective_modules(MOE_SHARED) == moe_shared


@pytest.mark.parametrize("cluster", [A100, H100], ids=["analytic", "kernel-level"])
def test_selective_time_adds_each_modules_forward(cluster):
    layer = LLAMA.layers[0]
    times = layer_compute_times(layer, 4096, 1, 2, True, cluster, 2, "flash")
    mlp, norms = module_forward_seconds(layer, 4096, 1, 2, True, cluster, 2)
    costs = {m: layer_cost(layer, SELECTIVE, 1, 4096, cluster, training(*m)).recompute_s
             for m in (("core_attn",), ("mlp",), ("layernorm",), ("core_attn", "mlp", "layernorm"))}
    assert costs[("core_attn",)] == pytest.approx(times.attention_core_forward_s)
    assert costs[("mlp",)] == pytest.approx(mlp) and costs[("layernorm",)] == pytest.approx(norms)
    assert costs[("core_attn", "mlp", "layernorm")] == pytest.approx(times.attention_core_forward_s + mlp + norms)
    assert 0 < norms < mlp < times.forward_s
    assert recompute_time(times, "none") == 0.0 and recompute_time(times, "full") == times.forward_s


def test_selective_memory_drops_each_modules_activations():
    """bf16, TP2 with SP, s = 4096: mlp drops the SwiGLU MLP's 4f per token (cost.memory.mlp_saved_width),
    layernorm the two norm outputs (2h per token, split by SP) and their fp32 statistics (RMSNorm: 1 each)."""
    layer, s = LLAMA.layers[0], 4096

    def kept(*modules):
        return layer_cost(layer, SELECTIVE, 1, s, H100, training(*modules)).activation_bytes

    f, h = layer.ffn_hidden_size, layer.hidden_size
    assert kept("core_attn") - kept("core_attn", "mlp") == pytest.approx(2 * s * 4 * f / 2)
    assert kept("core_attn") - kept("core_attn", "layernorm") == pytest.approx((2 * 2 * h * s + 2 * 4 * s) / 2)


def test_megatron_flags_name_the_modules_unless_they_are_megatrons_default():
    config = UniformConfig(tp=2, pp=1, micro_batch_size=1, sequence_parallel=True, recompute="selective")
    plan = build_uniform_plan(LLAMA, H100, training("mlp", "layernorm"), config)
    default = replace(plan, prediction=estimate_plan(plan, LLAMA, H100, training()))
    priced = replace(plan, prediction=estimate_plan(plan, LLAMA, H100, training("mlp", "layernorm")))
    assert "--recompute-modules" not in megatron_flags(default)
    flags = megatron_flags(priced)
    at = flags.index("--recompute-granularity")
    assert flags[at:at + 5] == ["--recompute-granularity", "selective", "--recompute-modules", "mlp", "layernorm"]
    assert _parse_flags(flags)["recompute_modules"] == ["mlp", "layernorm"]
    assert "  --recompute-modules mlp layernorm \\\n" in plan_table(priced)
    assert priced.prediction.peak_memory_gib < default.prediction.peak_memory_gib


def test_mlp_with_linear_biases_is_refused_with_one_line(capsys):
    assert recompute_modules_problem(LLAMA.layers, ("mlp",)) is None
    assert "--disable-bias-linear" in recompute_modules_problem(MODEL_PRESETS["gpt3-1.7b"].layers, ("mlp",))
    assert main(["plan", "--model", "gpt3-1.7b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "64",
                 "--recompute-modules", "mlp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot recompute an MLP with linear biases" in err[0]


def test_estimate_prices_the_modules_it_is_given(capsys):
    base = ["estimate", "--model", "llama2-7b", "--cluster", "dgx-h100-80gb", "--global-batch-size", "64", "--tp", "2",
            "--pp", "1", "--micro-batch-size", "1", "--sequence-parallel", "--recompute", "selective", "--json"]
    results = {}
    for modules in (["core_attn"], ["mlp"]):
        assert main(base + ["--recompute-modules", *modules]) == 0
        results[modules[0]] = json.loads(capsys.readouterr().out)
    assert results["mlp"]["peak_memory_gib"] < results["core_attn"]["peak_memory_gib"]
    assert results["mlp"]["iteration_time_s"] > results["core_attn"]["iteration_time_s"]
    assert results["mlp"]["megatron_flags"][-4:-2] == ["--recompute-modules", "mlp"]


def test_moe_act_drops_fc2_s_input_and_runs_the_activation_again():
    """--recompute-modules moe_act (priced when given, not searched or run here): the experts keep fc1's output
    and not fc2's input, f per routed copy in 16-bit (in FP8 fc2's own 1-byte copy stays), and the backward
    re-runs the activation pass; the grouped GEMM and a non-delayed FP8 recipe are needed, as in Megatron-Core."""
    from megatron_auto.cost.moe import expert_cost, expert_tokens

    strategy = LayerStrategy(tp=1, dp=8, ep=8, recompute="selective")
    grouped = TrainingSpec(global_batch_size=64, moe_grouped_gemm=True, bias_activation_fusion=True)
    base, act = (expert_cost(MOE_SHARED, strategy, 1, 4096, H100, replace(grouped, recompute_modules=modules))
                 for modules in (("core_attn",), ("core_attn", "moe_act")))
    copies = expert_tokens(MOE_SHARED, 4096, 1, strategy, 1.0)
    f = MOE_SHARED.moe.expert_ffn_hidden_size
    assert base.activation_bytes - act.activation_bytes == pytest.approx(2 * copies * f)
    from megatron_auto.cost.kernel_rates import elementwise_bandwidth

    # SwiGLU's activation pass: 5f bytes-per-element per copy in bf16 (expert_memory_bytes), at HBM pace.
    assert base.recompute_s == 0.0
    assert act.recompute_s == pytest.approx(2 * 5 * f * copies / elementwise_bandwidth(H100))
    assert act.recompute_s < act.forward_s
    fp8 = replace(grouped, precision="fp8", fp8_recipe="tensorwise")
    base8, act8 = (expert_cost(MOE_SHARED, strategy, 1, 4096, H100, replace(fp8, recompute_modules=modules))
                   for modules in (("core_attn",), ("core_attn", "moe_act")))
    assert act8.activation_bytes == pytest.approx(base8.activation_bytes)  # fc2's FP8 copy is what stays
    with pytest.raises(ValueError, match="needs --moe-grouped-gemm"):
        TrainingSpec(global_batch_size=8, recompute_modules=("moe_act",))
    with pytest.raises(ValueError, match="delayed scaling"):
        replace(fp8, fp8_recipe="delayed", recompute_modules=("moe_act",))
